"""Scripts that run inside the vLLM worker's virtual environment, not inside Django.

Modules here are executed by path with the worker venv's python (``settings.WORKER_PYTHON``).
Their top-level imports must stay within the standard library: the web app imports them for
constants (file names, paths) and must never pull in torch, transformers or vllm.
"""
