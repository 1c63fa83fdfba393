"""ASGI entry point: ``uvicorn shopsite.asgi:application``. Served this
way, the everystep console streams live updates (under WSGI its pages
poll every 2 s unless ``EVERYSTEP["CONSOLE_STREAM"]`` is True)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shopsite.settings")
application = get_asgi_application()
