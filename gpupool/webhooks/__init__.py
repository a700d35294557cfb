"""Webhooks: events recorded with the job states they announce, delivered by one sender.

Events are enqueued in the same transaction as what they announce, so an
event exists exactly when its change was stored; ``gpupool webhooks run`` (or
``python -m gpupool.webhooks``; one per cluster) sends them, and nothing in a
request or in the refresher waits on a receiver. Receivers are checked twice
against server-side request forgery: when the URL is registered and before
every attempt.

The modules, one job each:

    events        the event types an endpoint may ask for
    destinations  what a webhook URL may point at (resolution and address checks)
    endpoints     the endpoints the service makes itself (a submit's callback_url) and signing secrets
    outbox        enqueueing events and their deliveries in the caller's transaction
    transport     an httpx transport whose every attempt ends by one deadline
    sender        ``WebhookSender``: claim, sign, POST, record, retry with backoff
    run           the sender as a long-running command (its arguments, logging, signals)
"""
