"""Full-screen views of the kwinspect TUI, one module per domain."""
