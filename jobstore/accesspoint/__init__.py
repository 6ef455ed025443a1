"""The access point's side: `jobstore schedd`, what the schedd and the shadow do on the
machine where jobs are submitted (their outputs written home)."""
