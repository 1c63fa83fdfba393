"""The operations console, served by Django: ``include()`` it in urls.py.

::

    urlpatterns = [
        ...,
        path("everystep/", include("everystep.contrib.django.console")),
    ]

The console's pages, JSON API, stream and assets then answer under that
prefix (any prefix: the pages tell the script where they are mounted).
Django's authentication decides who sees what: the
``everystep.view_run`` permission to look, ``everystep.operate_console``
to act (resolve, requeue, cancel, run again, kill, scale); an anonymous
visitor is sent to the login page (the API answers 403), and every POST
needs Django's CSRF token, which the pages hand the script.

Nothing is written twice: ``views`` checks permissions and calls the same
handlers as ``everystep ui`` (``everystep.web.handlers``); ``bridge`` turns
their replies and stream into Django responses.
"""

from .urls import app_name, urlpatterns

__all__ = ["app_name", "urlpatterns"]
