"""The reference driver for PyTorch FSDP2 (fully_shard), built on the kit: models.py (the
seeds' models, state_dict keys as the suite's weights files name them), cpu_streams.py (what
2.4/2.5's FSDP2 needs to run without CUDA), scenarios.py (the implemented scenarios) and
__main__.py (python -m fsdp_conform_driver.pytorch <protocol flags>).
"""
