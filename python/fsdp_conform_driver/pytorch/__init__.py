"""The reference driver for PyTorch FSDP2 (fully_shard) and FSDP1 (FullyShardedDataParallel),
built on the kit: models.py (the seeds' models, state_dict keys as the suite's weights files
name them), cpu_streams.py and cpu_copy_out.py (what 2.4/2.5's FSDP2 needs to run without
CUDA), fsdp_api.py / fsdp1_api.py (the two APIs as a case's parameters spell them), parity.py
(parity/*), grad_acc.py (fsdp_grad_acc/*), scenarios.py (the table of implemented scenarios)
and __main__.py (python -m fsdp_conform_driver.pytorch <protocol flags>).
"""
