"""Tiny training scripts that use sia_grpc.train, on data they generate.

    python -m sia_grpc.train.examples.mlp   # 8-class Gaussian mixture, MLP, SGD (AdaScale)
    python -m sia_grpc.train.examples.cnn   # 12x12 stroke images, small CNN, Adam (sqrt rule)

Each trains to a meaningful accuracy in seconds on one CPU core, prints one line
per epoch from rank 0, and runs alone, under torchrun, or under the node agent
(which resizes, checkpoints and restarts it).
"""
