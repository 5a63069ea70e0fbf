"""What `graphlint memory` can be asked for, as the command checks it before anything imports torch: a request
answered from the result cache never imports it."""

OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "none")
DDP_BUCKET_MB = 25  # DistributedDataParallel's bucket_cap_mb default
