"""The stream's spine: options -> one resolved configuration -> the memory plan -> the feeds (inline, pooled, in a
feeder process) -> the Stream users iterate."""
