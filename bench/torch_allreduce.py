"""init_process_group("gloo") from the environment, one all_reduce, done: the torch
program bench/compare.py runs under each launcher."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1024)
dist.all_reduce(t)
assert float(t[0]) == dist.get_world_size()
dist.destroy_process_group()
