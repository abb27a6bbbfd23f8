"""Taking in a stranger's files, shared by every layer (a ground package): text that is
valid Unicode whatever the input spelled (`text`), files opened only when regular and the
budgets that bound what a file can make gpudiag do (`files`), and a saved trace's Parquet
tables checked against the schema before a row is decoded (`tables`)."""
