"""Names vulture reports unused that are used, from outside what it reads.

Read by vulture (``tests/test_dead_code.py``, ``[tool.vulture]`` in
pyproject.toml), never imported: each line only mentions a name, which is
how vulture learns it is used. vulture matches by name, so a name here is
kept everywhere: add one only with the reason it is called, never for code
that is merely unused (delete that). Django's decorated admin hooks
(``@admin.register``, ``@admin.display``, ``@admin.action``) and system
checks (``@checks.register``) are skipped by ``ignore_decorators`` instead.
"""

# ruff: noqa
# mypy: ignore-errors
_ = object()

# -- Django calls these: model admin options and permission hooks, model field
# hooks, Meta options, an app config, migration attributes, the arguments of
# hooks it calls by keyword (a check's app_configs, a signal's sender) or
# whose signature it fixes (a list filter's model_admin, from_db_value's
# expression).
_.parameter_name
_.model_admin
_.has_add_permission
_.has_change_permission
_.has_delete_permission
_.model
_.fk_name
_.ordering
_.can_delete
_.show_change_link
_.readonly_fields
_.list_display
_.list_filter
_.search_fields
_.search_help_text
_.list_per_page
_.show_full_result_count
_.inlines
_.EverystepConfig  # INSTALLED_APPS names the package; Django finds its AppConfig
_.verbose_name
_.default_auto_field
_.app_configs
_.sender
_.initial
_.dependencies
_.get_db_prep_value
_.from_db_value
_.expression
_.Meta
_.abstract
_.managed
_.db_table
_.default_permissions
_.permissions
_.save  # ReadOnly refuses Django's writes
_.delete

# -- http.server and uvicorn call these overrides.
_.do_GET
_.log_message
_.daemon_threads
_.capture_signals

# -- Loaded by name: a backend's Store class from store.BACKENDS
# ("everystep.store.sqlite:SQLiteStore"); Metrics fields through
# Metrics._child(name, ...); a protocol message's fields through
# dataclasses.asdict (the supervisor's status reply).
_.SQLiteStore
_.MariaDBStore
_.workflow_duration
_.step_duration
_.steps_in_flight

# -- Read by the tests as part of an object's public face: docgen's check
# that every option has help (tests/test_docs.py), and Child.delivered, the
# state the parent's buffer leaves a child in (tests/test_child_states.py).
_.undocumented_options
_.delivered
