# Writes the C++ program between `<!-- embed-example:begin -->` and `<!-- embed-example:end -->` in
# INPUT (README.md), without its ```cpp fence, to OUTPUT. Fails, naming the file, when the markers
# or the fence are missing, so a README edit cannot silently drop the example from the tests.
# Usage: cmake -DINPUT=README.md -DOUTPUT=example.cpp -P extract_snippet.cmake
file(READ "${INPUT}" text)
set(begin_marker "<!-- embed-example:begin -->")
set(end_marker "<!-- embed-example:end -->")
string(FIND "${text}" "${begin_marker}" begin_at)
string(FIND "${text}" "${end_marker}" end_at)
if(begin_at EQUAL -1 OR end_at EQUAL -1 OR end_at LESS begin_at)
  message(FATAL_ERROR "${INPUT}: the embedding example markers ${begin_marker} ... ${end_marker} "
                      "are missing or out of order")
endif()
string(LENGTH "${begin_marker}" begin_len)
math(EXPR from "${begin_at} + ${begin_len}")
math(EXPR len "${end_at} - ${from}")
string(SUBSTRING "${text}" ${from} ${len} block)
string(FIND "${block}" "```cpp\n" fence_at)
string(FIND "${block}" "\n```" close_at REVERSE)
if(fence_at EQUAL -1 OR close_at EQUAL -1 OR close_at LESS fence_at)
  message(FATAL_ERROR "${INPUT}: the embedding example is not one ```cpp fenced block")
endif()
math(EXPR code_from "${fence_at} + 7")
math(EXPR code_len "${close_at} - ${code_from} + 1")
string(SUBSTRING "${block}" ${code_from} ${code_len} code)
file(WRITE "${OUTPUT}.tmp" "// Extracted from ${INPUT} by tests/e2e/extract_snippet.cmake; edit the README.\n${code}")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
