"""Staging the GPU check onto a machine reached only by copying files (tools/README.md).

These modules may import medusa_lib; medusa_lib never imports them.
"""
