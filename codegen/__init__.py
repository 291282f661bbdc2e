"""Build-time code generators (not shipped: the wheel holds only kwinspect/).

    python -m codegen.schema [--check]   # kwinspect/protocol/schema/ from Kafka's message JSON
"""
