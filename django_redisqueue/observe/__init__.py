"""What operators watch: the metrics (counting and the Prometheus exposition) and the
JSON log format."""
