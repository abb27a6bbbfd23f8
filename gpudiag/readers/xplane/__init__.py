"""XSpace protobuf (`wire`: our own wire-format walker; `space`: the planes) and the JAX Perfetto
JSON, through one classification (`tables`, `reader`)."""
