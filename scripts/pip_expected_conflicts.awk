# Filter pip's stderr: drop the one dependency conflict scripts/setup.sh causes on purpose, keep the rest.
#
#   pip install ... 2> >(awk -f scripts/pip_expected_conflicts.awk >&2)
#
# The ALFWorld engine is installed with --no-deps so that jericho 3.3.1 does not pull spaCy (~130 MB), which the
# text engine never imports. Every later pip install then ends with pip's post-install check:
#
#   ERROR: pip's dependency resolver does not currently take into account all the packages ...
#   jericho 3.3.1 requires spacy>=2.1.0, which is not installed.
#
# That block is not a failure (pip exits 0), but it reads like one. This filter removes the jericho/spaCy line,
# and the block's heading when no other conflict is in it, and says in one line what was skipped and why. Any
# other conflict keeps the heading and is shown; every other line passes through unchanged.
function end_block() {
  # a heading whose only conflict was the expected one is dropped with it
  if (heading != "" && !block_skipped) print heading
  heading = ""; in_block = 0; block_skipped = 0
}
/^ERROR: pip.s dependency resolver does not currently take into account/ {
  end_block(); heading = $0; in_block = 1; next
}
in_block && /^[^ ]+ [^ ]+ requires / {
  if ($0 ~ /^jericho [^ ]+ requires spacy/) { skipped = 1; block_skipped = 1; next }
  if (heading != "") { print heading; heading = "" }
  print; next
}
{ end_block(); print }
END {
  end_block()
  if (skipped) print "[setup] skipped spaCy on purpose: jericho lists it, the ALFWorld text engine never imports it (pip's notice about it hidden)"
}
