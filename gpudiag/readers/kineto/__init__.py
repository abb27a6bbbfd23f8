"""PyTorch profiler (Kineto) traces: the tables (`reader`), the events as compact columns
(`events`), NCCL and gloo collectives (`collectives`), the repair of Kineto's unescaped names
(`repair`)."""
