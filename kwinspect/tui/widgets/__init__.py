"""Widgets of the kwinspect TUI; each defines the messages it sends."""
