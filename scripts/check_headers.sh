#!/usr/bin/env bash
# Include what you use, checked two ways, so that the tree does not build only thanks to what
# one standard library happens to include inside its own headers (libstdc++ 13 dropped many
# such includes, <cstdint> among them):
#
#   scripts/check_headers.sh [--symbols] [--compile] [--libcxx] [-j N] [--build DIR]
#
# --symbols  every header and source under the library's rooms, tools, tests, bench, examples
#            and fuzz names a standard header (directly, or through project headers it
#            includes) for each standard name it uses from a table of unambiguous names
#            (std::vector -> <vector>, uint8_t -> <cstdint>, std::memcpy -> <cstring>, ...).
#            Fast: no compiler runs.
# --compile  every .h under core/ kernels/ autograd/ nn/ optim/ data/ distributed/ tools/ and
#            include/ compiles alone (a translation unit of just `#include "that.h"`) with
#            g++ -fsyntax-only;
# --libcxx   ... and with clang++ -stdlib=libc++ (libc++'s own headers include different
#            things from libstdc++'s), when libc++ is installed (Debian: libc++-14-dev).
# With no option: --symbols --compile, plus --libcxx where libc++ is there. --build DIR names a
# configured build folder for the generated <ember/version.h> (default: the first found).
# Exits 1 and lists the offenders when a check fails.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD
SYMBOLS=0 COMPILE=0 LIBCXX=0 JOBS=$(nproc) BUILD_DIR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --symbols) SYMBOLS=1; shift ;;
    --compile) COMPILE=1; shift ;;
    --libcxx) LIBCXX=1; shift ;;
    -j) JOBS="$2"; shift 2 ;;
    --build) BUILD_DIR="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "check_headers: unknown option $1" >&2; exit 2 ;;
  esac
done
HAVE_LIBCXX=0
if command -v clang++ >/dev/null &&
   echo '#include <vector>' | clang++ -stdlib=libc++ -std=c++20 -x c++ -fsyntax-only - 2>/dev/null; then
  HAVE_LIBCXX=1
fi
if [[ $SYMBOLS == 0 && $COMPILE == 0 && $LIBCXX == 0 ]]; then
  SYMBOLS=1 COMPILE=1 LIBCXX=$HAVE_LIBCXX
fi
STATUS=0

if [[ $SYMBOLS == 1 ]]; then
  echo "== standard names and the headers that declare them"
  python3 - "$ROOT" core,kernels,autograd,nn,optim,data,distributed,tools,include,tests,bench,examples,fuzz <<'PY' || STATUS=1
import os, re, sys
ROOT = sys.argv[1]
DIRS = sys.argv[2].split(',')
# header -> the names it declares that no other standard header is required to provide
# ("a|b": either header will do). Comments, strings and character literals are ignored.
SYMS = {
 'cstdint': r'\b(?:std::)?u?int(?:8|16|32|64)_t\b|\b(?:std::)?u?intptr_t\b|\bU?INT(?:8|16|32|64)_(?:MAX|MIN)\b|\bSIZE_MAX\b',
 'cstdio': r'\bstd::(?:s?n?printf|fopen|fclose|fread|fwrite|fflush|fputs|fgets|FILE|remove|rename|puts|perror|fseek|ftell)\b|\b(?:snprintf|fprintf|fopen|fclose|fflush|fputs|fgets|fread|fwrite|perror)\s*\(|\bstderr\b|\bstdout\b',
 'cstring': r'\bstd::(?:memcpy|memset|memcmp|memmove|strlen|strcmp|strncmp|strchr|strrchr|strerror|strstr)\b|\b(?:memcpy|memset|memcmp|memmove|strlen|strcmp|strncmp|strrchr|strerror)\s*\(',
 'cstdlib': r'\bstd::(?:getenv|abort|exit|strtol|strtoll|strtoul|strtoull|strtod|strtof|atoi|malloc|free|aligned_alloc|system|setenv|unsetenv|qsort)\b|\b(?:getenv|setenv|unsetenv|aligned_alloc)\s*\(',
 'cmath': r'\bstd::(?:sqrt|exp|log|log1p|expm1|pow|fabs|tanh|erf|erfc|isnan|isinf|isfinite|ceil|floor|round|lround|llround|nearbyint|fma|cos|sin|ldexp|frexp|fmod|copysign|nextafter|signbit|trunc|cbrt|log2|exp2|hypot|atan2|lgamma|tgamma|modf|rint|lrint|llrint)\s*\(',
 'cmath|cstdlib': r'\bstd::abs\s*\(',
 'string': r'\bstd::(?:string|to_string|stoi|stol|stoll|stoul|stoull|stod|stof|getline|basic_string)\b',
 'string_view': r'\bstd::string_view\b',
 'vector': r'\bstd::vector\b',
 'map': r'\bstd::(?:map|multimap)\b',
 'unordered_map': r'\bstd::unordered_(?:multi)?map\b',
 'set': r'\bstd::(?:set|multiset)\b',
 'unordered_set': r'\bstd::unordered_(?:multi)?set\b',
 'memory': r'\bstd::(?:shared_ptr|unique_ptr|make_shared|make_unique|weak_ptr|enable_shared_from_this|allocate_shared|static_pointer_cast|dynamic_pointer_cast|addressof|align)\b',
 'functional': r'\bstd::(?:function|bind|ref|cref|invoke|less|greater|plus|multiplies|equal_to|bit_and|bit_or|not_fn|reference_wrapper)\b',
 'mutex': r'\bstd::(?:mutex|recursive_mutex|lock_guard|unique_lock|scoped_lock|once_flag|call_once|timed_mutex)\b',
 'shared_mutex': r'\bstd::(?:shared_mutex|shared_lock)\b',
 'condition_variable': r'\bstd::condition_variable(?:_any)?\b',
 'thread': r'\bstd::(?:thread|this_thread|jthread)\b',
 'atomic': r'\bstd::(?:atomic|atomic_flag|memory_order\w*|atomic_thread_fence)\b',
 'chrono': r'\bstd::chrono\b',
 'optional': r'\bstd::(?:optional|nullopt|make_optional|nullopt_t)\b',
 'variant': r'\bstd::(?:variant|visit|get_if|holds_alternative|monostate)\b',
 'array': r'\bstd::array\b',
 'deque': r'\bstd::deque\b',
 'list': r'\bstd::list\b',
 'queue': r'\bstd::(?:queue|priority_queue)\b',
 'span': r'\bstd::span\b',
 'tuple': r'\bstd::(?:tuple|make_tuple|tie|tuple_size|tuple_element|apply|forward_as_tuple)\b',
 'utility': r'\bstd::(?:pair|make_pair|forward|exchange|index_sequence|make_index_sequence|integer_sequence|in_place|declval|as_const|cmp_less|unreachable)\b',
 'algorithm': r'\bstd::(?:sort|stable_sort|min_element|max_element|minmax_element|find|find_if|find_if_not|count|count_if|all_of|any_of|none_of|fill|fill_n|copy|copy_n|copy_if|reverse|unique|lower_bound|upper_bound|binary_search|transform|equal|remove_if|replace|shuffle|nth_element|partial_sort|clamp|max|min|minmax|for_each|rotate|partition|stable_partition|mismatch|search|generate|lexicographical_compare|includes|set_difference|set_intersection|set_union|is_sorted|sample|ranges)\b',
 'numeric': r'\bstd::(?:accumulate|iota|inner_product|partial_sum|exclusive_scan|inclusive_scan|reduce|gcd|lcm|transform_reduce|adjacent_difference|midpoint)\b',
 'limits': r'\bstd::numeric_limits\b',
 'type_traits': r'\bstd::(?:is_same|is_same_v|enable_if|enable_if_t|conditional|conditional_t|decay_t|decay|remove_cv_t|remove_reference_t|remove_cvref_t|is_integral|is_integral_v|is_floating_point|is_floating_point_v|is_signed_v|is_unsigned_v|is_arithmetic_v|true_type|false_type|integral_constant|bool_constant|is_trivially_copyable_v|is_invocable_v|invoke_result_t|underlying_type_t|is_pointer_v|is_void_v|is_const_v|is_enum_v|is_base_of_v|is_convertible_v|is_constructible_v|common_type_t|make_unsigned_t|make_signed_t|is_empty_v|remove_const_t|add_const_t|is_reference_v|type_identity_t|is_class_v|is_standard_layout_v|is_default_constructible_v|is_nothrow_move_constructible_v|is_trivial_v|is_lvalue_reference_v|is_same_v|remove_pointer_t)\b',
 'sstream': r'\bstd::(?:ostringstream|istringstream|stringstream)\b',
 'fstream': r'\bstd::(?:ofstream|ifstream|fstream)\b',
 'iostream': r'\bstd::(?:cout|cerr|cin|clog)\b',
 'ostream': r'\bstd::(?:ostream|endl|flush)\b',
 'istream': r'\bstd::istream\b',
 'iomanip': r'\bstd::(?:setw|setprecision|setfill|put_time|quoted)\b',
 'stdexcept': r'\bstd::(?:runtime_error|logic_error|invalid_argument|out_of_range|overflow_error|range_error|length_error|domain_error|underflow_error)\b',
 'exception': r'\bstd::(?:exception_ptr|current_exception|rethrow_exception|make_exception_ptr|terminate|uncaught_exceptions|nested_exception|exception)\b',
 'filesystem': r'\bstd::filesystem\b',
 'random': r'\bstd::(?:mt19937(?:_64)?|uniform_int_distribution|uniform_real_distribution|normal_distribution|random_device|bernoulli_distribution|discrete_distribution|minstd_rand)\b',
 'bit': r'\bstd::(?:bit_cast|bit_width|popcount|countl_zero|countr_zero|has_single_bit|bit_ceil|bit_floor|rotl|rotr|endian)\b',
 'initializer_list': r'\bstd::initializer_list\b',
 'compare': r'\bstd::(?:strong_ordering|weak_ordering|partial_ordering)\b',
 'iterator': r'\bstd::(?:back_inserter|inserter|next|prev|advance|distance|iterator_traits|make_move_iterator|reverse_iterator|istreambuf_iterator|ostream_iterator|random_access_iterator_tag|forward_iterator_tag|input_iterator_tag)\b',
 'cctype': r'\bstd::(?:isspace|isdigit|isalpha|isalnum|tolower|toupper|isupper|islower|ispunct|isxdigit|isprint)\b',
 'cerrno': r'\berrno\b',
 'charconv': r'\bstd::(?:from_chars|to_chars|chars_format)\b',
 'csignal': r'\bstd::(?:signal|raise)\s*\(|\bSIG(?:INT|TERM|KILL|SEGV|ABRT|PIPE|CHLD|HUP|USR1|USR2)\b',
 'cassert': r'\bassert\s*\(',
 'future': r'\bstd::(?:future|promise|async|packaged_task|shared_future|launch)\b',
 'new': r'\bstd::(?:nothrow|align_val_t|bad_alloc|launder|hardware_destructive_interference_size)\b',
 'any': r'\bstd::(?:any|any_cast)\b',
 'regex': r'\bstd::(?:regex|regex_match|regex_search|smatch|regex_replace)\b',
 'cstddef': r'\bstd::(?:size_t|ptrdiff_t|byte|max_align_t|nullptr_t)\b',
 'numbers': r'\bstd::numbers\b',
 'concepts': r'\bstd::(?:integral|floating_point|same_as|convertible_to|invocable)\b(?!_)',
 'source_location': r'\bstd::source_location\b',
 'ranges': r'\bstd::(?:views|ranges)\b',
}
# Headers whose synopsis includes another (or that must declare its names to be usable),
# and the C headers that stand for their <c...> versions.
IMPLIES = {
 'iostream': {'ostream', 'istream'}, 'sstream': {'ostream', 'istream', 'string'}, 'fstream': {'ostream', 'istream'},
 'cinttypes': {'cstdint'}, 'stdint.h': {'cstdint'}, 'inttypes.h': {'cstdint'}, 'stdio.h': {'cstdio'}, 'string.h': {'cstring'},
 'stdlib.h': {'cstdlib'}, 'math.h': {'cmath'}, 'algorithm': set(), 'istream': {'ostream'},
 'ranges': {'iterator', 'initializer_list', 'compare'}, 'utility': {'initializer_list', 'compare'},
 'string': {'initializer_list', 'compare'}, 'vector': {'initializer_list', 'compare'},
 'map': {'initializer_list', 'compare'}, 'set': {'initializer_list', 'compare'}, 'unordered_map': {'initializer_list', 'compare'},
 'unordered_set': {'initializer_list', 'compare'}, 'array': {'initializer_list', 'compare'}, 'deque': {'initializer_list', 'compare'},
 'list': {'initializer_list', 'compare'}, 'iterator': {'compare'}, 'tuple': {'compare'}, 'optional': {'compare'},
 'variant': {'compare'}, 'chrono': {'compare'}, 'memory': {'compare'}, 'thread': {'compare'},
 'filesystem': {'compare'}, 'span': {'compare'}, 'string_view': {'compare'},
 'queue': {'initializer_list', 'compare', 'deque', 'vector'}, 'cerrno': set(), 'errno.h': {'cerrno'},
 'signal.h': {'csignal'}, 'assert.h': {'cassert'}, 'ctype.h': {'cctype'}, 'stddef.h': {'cstddef'},
 'mutex': set(), 'condition_variable': set(), 'stdexcept': {'exception'}, 'new': {'exception'},
 'map': {'initializer_list', 'compare', 'utility'}, 'unordered_map': {'initializer_list', 'compare', 'utility'},
 'set': {'initializer_list', 'compare', 'utility'}, 'unordered_set': {'initializer_list', 'compare', 'utility'}, 'tuple': {'compare', 'utility'},
}
inc_re = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
# The text without comments, string and character literals.
def strip(text):
    text = re.sub(r'/\*.*?\*/', ' ', text, flags=re.S)
    text = re.sub(r'//[^\n]*', '', text)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    text = re.sub(r"'(?:\\.|[^'\\\n])'", "''", text)
    return text
cache = {}
# A quoted include resolved as the build does: the including file's folder, the root,
# include/ and tests/support/; None for a file outside the tree.
def resolve(name, frm):
    for base in (os.path.dirname(frm), ROOT, os.path.join(ROOT, 'include'), os.path.join(ROOT, 'tests', 'support')):
        p = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(p) and p.startswith(ROOT):
            return p
    return None
# The standard headers `path` includes, itself or through project headers.
def std_closure(path, seen=None):
    if path in cache: return cache[path]
    seen = seen or set()
    if path in seen: return set()
    seen.add(path)
    text = open(path, errors='replace').read()
    out = set()
    for kind, name in inc_re.findall(text):
        p = resolve(name, path) if kind == '"' else None
        if p:
            out |= std_closure(p, seen)
        elif kind == '<':
            out.add(name)
            out |= IMPLIES.get(name, set())
    cache[path] = out
    return out
files = []
for d in DIRS:
    for dp, dn, fn in os.walk(os.path.join(ROOT, d)):
        for f in fn:
            if f.endswith(('.h', '.hpp', '.cuh', '.cpp', '.cu', '.cc')):
                files.append(os.path.join(dp, f))
bad = 0
for f in sorted(files):
    text = strip(open(f, errors='replace').read())
    have = std_closure(f)
    missing = []
    for hdr, rx in SYMS.items():
        if any(h in have for h in hdr.split('|')): continue
        m = re.search(rx, text)
        if m: missing.append((hdr, m.group(0).strip()))
    if missing:
        bad += 1
        print(os.path.relpath(f, ROOT) + ': ' + ', '.join(f'<{h}> ({s})' for h, s in missing))
print(f'{bad} of {len(files)} files use standard names whose header they do not include')
sys.exit(1 if bad else 0)
PY
fi

if [[ $COMPILE == 1 || $LIBCXX == 1 ]]; then
  if [[ -z $BUILD_DIR ]]; then
    for d in build build-*; do
      [[ -f "$d/include/ember/version.h" ]] && { BUILD_DIR=$d; break; }
    done
  fi
  FLAGS=(-std=c++20 -fsyntax-only -Wall -Wextra -Wno-unused-parameter -DEMBER_WITH_CUDA=1 -DEMBER_WITH_NCCL=1
         -I"$ROOT" -I"$ROOT/include" -isystem /usr/include/eigen3)
  [[ -n $BUILD_DIR ]] && FLAGS+=(-I"$ROOT/$BUILD_DIR/include")
  [[ -d /usr/local/cuda/include ]] && FLAGS+=(-isystem /usr/local/cuda/include)
  mapfile -t HEADERS < <(find core kernels autograd nn optim data distributed tools include -name '*.h' | sort)
  # Headers of the CUDA backend need the toolkit's headers; without them they are not checked.
  if [[ ! -f /usr/local/cuda/include/cuda_runtime_api.h ]]; then
    mapfile -t HEADERS < <(printf '%s\n' "${HEADERS[@]}" | grep -v -e '^kernels/cuda/' -e '^distributed/nccl/' -e '^include/ember/cuda.h')
  fi
  ERRS="$(mktemp -d)"
  # compile_alone HEADER COMPILER ARGS...: the header as the whole translation unit
  compile_alone() {
    local header=$1
    shift
    printf '#include "%s"\n' "$header" | "$@" -x c++ - > "$ERRS/${header//\//_}.err" 2>&1 ||
      { echo "--- $header"; head -6 "$ERRS/${header//\//_}.err"; }
  }
  check_with() {  # check_with LABEL COMPILER ARGS...
    local label=$1 out h
    shift
    echo "== ${#HEADERS[@]} headers alone with $label"
    out=$(for h in "${HEADERS[@]}"; do
            while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n; done
            compile_alone "$h" "$@" &
          done
          wait)
    if [[ -n $out ]]; then
      echo "$out"
      STATUS=1
    else
      echo "all compile alone"
    fi
  }
  [[ $COMPILE == 1 ]] && check_with "g++ ($(g++ -dumpfullversion), libstdc++)" g++ "${FLAGS[@]}"
  if [[ $LIBCXX == 1 ]]; then
    if [[ $HAVE_LIBCXX == 1 ]]; then
      check_with "clang++ -stdlib=libc++ ($(clang++ -dumpversion))" clang++ -stdlib=libc++ "${FLAGS[@]}"
    else
      echo "== libc++ is not installed (Debian: libc++-14-dev): the libc++ pass is skipped"
    fi
  fi
fi
[[ -n ${ERRS:-} ]] && rm -rf "$ERRS"
exit $STATUS
