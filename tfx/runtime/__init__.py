"""How the model runs on the machine: ranks (distributed.py), FSDP2 sharding, mixed precision, torch.compile."""
