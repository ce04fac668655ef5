"""The OpenAI-compatible API under `/v1`: `GET /v1/models` and `POST /v1/chat/completions`.

Third-party clients and SDKs use the service as they would use OpenAI, with a key from
`/accounts/api-keys/` as their API key. A request goes through the web chat's path
(`conversations.turns.turn_from_messages`): plan, input moderation, quota reservation, the
scheduler, output moderation, the usage ledger. A key that keeps nothing takes the same
path without its writes (`turns.turn_unkept`): no conversation, message or generation row,
the answer's life in Redis, its usage written to the ledger in batches. Answers and errors
come in OpenAI's shapes.

- `parsing` reads and checks a request body into a `ChatCompletionRequest`;
- `errors` is OpenAI's error shape and the mapping of our error codes onto it;
- `shapes` builds `chat.completion` and `chat.completion.chunk` objects from stream events;
- `views` are the async views (the uvicorn edge): they tail the generation's Redis Stream.
"""
