"""Cluster tier of the test suite: a real control plane, fake GPU nodes, real objects.

`devenv.cluster` starts the control plane as local processes; `conftest.py` hands it to
the tests as the `cluster` fixture.
"""
