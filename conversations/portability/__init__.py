"""Export and import of conversations (#18).

- `export`: one conversation as the service's JSON (its whole tree) or Markdown (the branch on
  screen); all of a user's data as a zip, streamed.
- `importers`: reading the service's JSON, its zip and ChatGPT's `conversations.json`, one
  conversation at a time (ijson), into `formats.ParsedConversation`s, checked.
- `services`: an upload kept in Postgres as an `ImportJob` and its pieces, its task queued.
- `importing`: the task's work: check every conversation, then write them all in one
  transaction, with progress in Redis; `tasks`: the Celery task; `selectors`: the owner's jobs.
"""
