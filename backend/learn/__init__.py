"""Learning on the op contract: autograd (the tape and every op's backward rule), the layers
(one class per layer kind, in a registry), the Network value and its spec, parameter init, the
optimizers, the training loop and safetensors I/O. Nothing here imports torch's autograd."""
