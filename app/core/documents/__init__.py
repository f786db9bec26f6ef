"""Documents a conversation asks about, with citations (issue 48): files and folders read bounded (`reading`), cut
along their structure (`chunks`), indexed per source in the cache folder with SQLite FTS5 and embeddings (`index`),
and the best chunks numbered into the prompt with the reply's [n] markers mapped back to them (`retrieval`)."""
