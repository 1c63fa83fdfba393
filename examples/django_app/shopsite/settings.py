"""Settings of the example shop: a Django project running everystep.

Development settings (a fixed secret key, DEBUG on). The database is a SQLite
file next to this project; for PostgreSQL, replace DATABASES["default"] with
e.g. {"ENGINE": "django.db.backends.postgresql", "NAME": "shop", "USER": ...,
"PASSWORD": ..., "HOST": ...}: everystep follows whatever this alias says.
"""

from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "example-only-not-a-secret"
DEBUG = True
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "everystep.contrib.django",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "shopsite.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "shopsite.wsgi.application"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": BASE_DIR / "db.sqlite3",
        # Wait up to 20 s for a lock instead of failing at once with
        # "database is locked": web requests and the supervisor's children
        # write to the same file (everystep keeps its transactions short).
        "OPTIONS": {"timeout": 20},
    }
}

# everystep: its tables live in the "default" database; shop.workflows
# defines the workflows (imported whenever Django starts).
EVERYSTEP = {
    "DATABASE": "default",
    "APPS": ["shop.workflows"],
}

# The everystep console (mounted in urls.py) sends visitors who are not
# logged in here.
LOGIN_URL = "admin:login"

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
