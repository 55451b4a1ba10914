"""The operator's runtime: the work queue, what each key's turn does, and how watch events
and the resync become keys. Kopf's handlers (vllm_operator.handlers) only call into it."""
