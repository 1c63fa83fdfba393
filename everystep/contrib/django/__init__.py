"""everystep inside a Django project (extra ``everystep[django]``).

Add ``"everystep.contrib.django"`` to ``INSTALLED_APPS`` and configure::

    EVERYSTEP = {
        "DATABASE": "default",          # the DATABASES alias everystep lives in
        "APPS": ["shop.workflows"],     # modules defining workflows
    }

Then ``everystep.schedule()`` writes through Django's own connection for
that alias, inside whatever ``transaction.atomic()`` block is open;
``manage.py migrate`` creates and upgrades everystep's tables with
everystep's own versioned migrations; ``everystep_worker``,
``everystep_supervisor``, ``everystep_runs`` and ``everystep_resolve_step``
are management commands; the admin lists runs and steps and resolves
blocked runs; ``include("everystep.contrib.django.console")`` in urls.py
mounts the operations console (``console``). Django is not a dependency of everystep's core: nothing
outside this package imports it.
"""
