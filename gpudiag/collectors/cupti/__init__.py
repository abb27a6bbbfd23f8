"""The CUPTI plugin (`plugin`), record layouts and the copy out of the buffer (`fields`), and the
record-to-table conversion (`records`)."""
