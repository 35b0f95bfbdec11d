"""``tlog serve``: the HTTP service that owns a tlog database (docs/SERVE.md).

- :mod:`tlog.web.endpoint`: ``<db>.serve.json``, finding a live service, and
  how other processes read the database while it runs (standard library only).
- :mod:`tlog.web.service`: the database gate, the watcher that ingests, the
  JSON answers.
- :mod:`tlog.web.app`: the Starlette application (pages, API, security).

Needs the ``serve`` extra (Starlette, uvicorn): ``pip install 'tlog[serve]'``.
"""
