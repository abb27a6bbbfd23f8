"""Nsight Systems: the SQLite export (`reader`), its schema versions as data (`schema`), `.nsys-
rep` through `nsys export` into a private folder (`export`)."""
