"""A user's unchanged script as a workload: its command built from perfkit's parameters, run as a
child of the kernel, its metrics read from what it prints (``notebooks/script.ipynb``). May import
``core``."""
