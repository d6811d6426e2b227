"""How far behind a stream is (:mod:`~sluice.lag.observe`), the history of it (:mod:`~sluice.lag.store`), and the
alerts it raises (:mod:`~sluice.lag.alerting`)."""
