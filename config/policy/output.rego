# Output policy: evaluated when a job SUCCEEDS, on the result metadata (SPEC section 5).
#
# input.job      as for the input policy
# input.result   {"worker_id", "result_ptr", "size_bytes", "content_type", "labels",
#                 "execution_ms"}
#
# Rule ksched reads:
#   quarantine     set of reasons; non-empty -> OUTPUT_QUARANTINED, DLQ output_quarantined
package ksched.output

# Permissive default: nothing is quarantined.
quarantine := set()

# --- example: replace the line above with the rules below to enforce it ---
# quarantine contains "output is labelled as containing PII" if {
#     input.result.labels.contains_pii == "true"
# }
#
# quarantine contains msg if {
#     input.result.size_bytes > 1073741824
#     msg := sprintf("output of %d bytes exceeds 1 GiB", [input.result.size_bytes])
# }
# --- end of example ---
