"""Thin command-line entry points (DESIGN.md, layer ``cli/``); the logic lives in the other layers."""
