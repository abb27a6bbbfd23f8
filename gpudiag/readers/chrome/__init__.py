"""Chrome-trace JSON shared by the Kineto and JAX Perfetto readers: msgspec event structs
(`structs`), and a streaming splitter that decodes a file in ~1 MB pieces within the budgets
(`stream`)."""
