"""Files a run leaves: crash-safe writes, locks and resume keys (`files`), and what made a result
(`provenance`)."""
