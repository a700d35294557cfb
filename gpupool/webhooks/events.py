"""The webhook event types: what an endpoint may ask for, and what each payload announces (api.event_schemas)."""

JOB_STARTED = "job.started"
JOB_ENDED = "job.ended"
# A spot job's run was preempted by a full-price job: it is requeued and runs again later.
JOB_PREEMPTED = "job.preempted"
# Every GPU of a running job stayed under its idle policy's threshold for the policy's window
# (gpupool.gpu_usage.idle); sent once per idle spell, by `gpupool idle check`.
JOB_IDLE = "job.idle"
# A run of the job was ended by a failed GPU (gpupool-gpu-check) and credited in full; sent by
# the billing pass that credits it, once per run (billing.gpu_failures). end_reason says gpu_failure.
JOB_FAILED = "job.failed"
# What a job's callback_url hears: the events about that job.
JOB_EVENT_TYPES = (JOB_STARTED, JOB_ENDED, JOB_PREEMPTED, JOB_IDLE, JOB_FAILED)
# About an account, not a job: a billing pass crossed a spend threshold, or forecasts the
# budget's end at the last 24 hours' rate (billing.alerts).
BUDGET_THRESHOLD = "budget.threshold"
BUDGET_FORECAST = "budget.forecast"
ACCOUNT_EVENT_TYPES = (BUDGET_THRESHOLD, BUDGET_FORECAST)
# Every type an endpoint may ask for; api.schemas.WebhookEventType spells the same list for pydantic.
EVENT_TYPES = JOB_EVENT_TYPES + ACCOUNT_EVENT_TYPES
# For the operator alone (gpupool.webhooks.operator), never an account's endpoint: the GPU check
# drained a node (billing.node_health, once per drain).
NODE_DRAINED = "node.drained"
OPERATOR_EVENT_TYPES = (NODE_DRAINED,)
