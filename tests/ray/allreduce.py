"""A rank of a gang job: joins the gloo group from the cluster's torchrun variables, all-reduces."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
node, master = os.environ["GPUCLUSTER_NODE"], os.environ["MASTER_ADDR"]
print(f"rank {dist.get_rank()} of {dist.get_world_size()} on {node} master {master} sum {t.item():g}", flush=True)
dist.destroy_process_group()
