"""Connection poolers in front of PostgreSQL: the ``pooler=`` URL parameter.

A pooler in transaction mode (PgBouncer's ``pool_mode = transaction``, RDS
Proxy, Supavisor) hands each transaction to whichever server connection is
free, so nothing a session holds survives from one transaction to the next:
prepared statements, ``SET``, ``LISTEN``, session advisory locks. A URL
ending in ``?pooler=transaction`` says that one is in between, and the
store then relies on none of them:

- no server-side prepared statements (psycopg's ``prepare_threshold=None``;
  ``postgres_hot`` sends its statements whole, unnamed), and the step
  records a runner writes for every run are calls of PL/pgSQL functions
  (``functions/postgres/step_records.sql``), whose plans the server keeps
  per session whichever client's transaction calls them, so only the short
  call is parsed and planned each time;
- settings go inside each transaction (``set_config(..., true)``, the
  function form of ``SET LOCAL``), sent with its statements in one round
  trip, never in the ``options`` startup parameter that a stock PgBouncer
  refuses; functions carry their own ``SET`` clauses as everywhere;
- advisory locks are transaction-scoped (``pg_advisory_xact_lock``), as
  they are everywhere;
- LISTEN goes over a URL of its own (``--listen-database``,
  ``EVERYSTEP_LISTEN_DATABASE_URL``); without one, runners poll.

``pooler=session`` (a pooler in session mode, which keeps a client on one
server connection) and ``pooler=none`` change nothing: such a connection
is used as a direct one.

No signal tells a pooler apart from a server reliably, so it is never
guessed: a pooler answers the startup and every query as PostgreSQL does
(PgBouncer passes the server's ``server_version`` and parameters through),
``inet_server_port()`` and ``pg_backend_pid()`` name the server behind it,
and a port that differs from the URL's is as likely a proxy, a container's
port mapping or a load balancer that changes nothing. The parameter is
taken out of the URL before libpq sees it (libpq refuses parameters it
does not know).
"""

from __future__ import annotations

from ..errors import EverystepError

PARAMETER = "pooler"
TRANSACTION = "transaction"
SESSION = "session"
NONE = "none"
#: Every value ``pooler=`` takes.
POOLERS = (TRANSACTION, SESSION, NONE)
#: The environment variable naming the URL runners LISTEN on.
LISTEN_ENV_VAR = "EVERYSTEP_LISTEN_DATABASE_URL"


def split(url: str) -> tuple[str, str]:
    """``url`` without its ``pooler=`` parameter, and the pooler it names
    (``none`` when it names none); an unknown value raises
    ``EverystepError`` naming the valid ones."""
    base, question, query = url.partition("?")
    if not question:
        return url, NONE
    kept = []
    pooler = NONE
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name != PARAMETER:
            kept.append(part)
            continue
        if value.lower() not in POOLERS:
            raise EverystepError(f"unknown {PARAMETER}={value} in the database URL: it takes "
                                 f"{', '.join(POOLERS[:-1])} or {POOLERS[-1]}")
        pooler = value.lower()
    kept = [part for part in kept if part]
    return (base + "?" + "&".join(kept) if kept else base), pooler


def listen_url(url: str) -> str:
    """The URL to LISTEN on, checked: a transaction pooler's cannot carry
    notifications (``EverystepError``, one line saying why)."""
    scheme = url.split(":", 1)[0].lower().partition("+")[0]
    if scheme not in ("postgresql", "postgres"):
        raise EverystepError(f"the LISTEN database URL must be a PostgreSQL one (postgresql://…), not {scheme}://…")
    if split(url)[1] == TRANSACTION:
        raise EverystepError(
            "the LISTEN database URL goes through a transaction pooler (pooler=transaction), where LISTEN cannot "
            "work: a notification reaches only the server session that listened, and the pooler hands that "
            "session to other clients between transactions; give a direct URL (or a session pooler's)")
    return url


__all__ = ["LISTEN_ENV_VAR", "NONE", "PARAMETER", "POOLERS", "SESSION", "TRANSACTION", "listen_url", "split"]
