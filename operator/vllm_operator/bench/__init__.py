"""The load generator (``vllm-operator bench``): realistic load against an OpenAI-compatible
endpoint, measured honestly.

Pure modules (no clock, no I/O, randomness only from a seeded RNG passed in): ``workload``
(lengths and prompts), ``arrivals`` (send schedules), ``stats`` (summaries), ``search``
(rate search and knee), ``result`` (the run, and its mapping onto the InferenceBenchmark
status). I/O: ``timing`` (an event loop with precise timers), ``client`` (sending and
recording), ``tokenizer``, ``run`` (a spec, run level by level), ``report`` and ``cli``.
"""
