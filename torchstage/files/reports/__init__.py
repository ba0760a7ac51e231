"""Presentation read from logdirs: training curves (plot) and scalability reports (report)."""
