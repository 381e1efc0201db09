"""``nest serve``: an OpenAI-compatible HTTP server with span citations, and a playground page.

Install the extra (``pip install 'nest-integrations[server]'``), then::

    nest ingest --sample
    nest serve --collection nest            # http://127.0.0.1:8000/ is the playground

Any OpenAI client works against ``http://127.0.0.1:8000/v1``; copied spans come back as
``url_citation`` annotations with the source offsets as extra keys (see ``protocol``).
"""

from nest_integrations.server.app import ServerSettings, create_app

__all__ = ["ServerSettings", "create_app"]
