"""`kwinspect sanitize`: a capture with what identifies people and systems replaced, still decodable.

Modules: `pseudonyms` (keyed hashes and stable names), `fields` (what each Kafka
message field becomes), `packets` (link/IP/TCP header rewriting: addresses,
sequence numbers, checksums), `pcapout` (the output file), `command` (the three
passes over the input and the report).  See docs/sanitize.md.
"""
