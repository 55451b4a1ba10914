"""Warmup of one vLLM server before it takes traffic (``vllm-operator warmup``).

``plan`` decides which requests to send (pure), ``run`` sends them over HTTP under one time
budget and judges the server, ``report`` is the result, ``cli`` the command. The package
talks HTTP only: it imports no Kopf and no Kubernetes client, so it runs in a plain Job.
"""
