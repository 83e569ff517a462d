// kvtier.BlockKey and the key helpers that need no runtime. A BlockKey is an immutable, hashable,
// picklable value equal to the C++ BlockKey field for field (lo, hi as unsigned 64-bit ints), so
// keys computed in one process are valid in another (the hash is fixed byte for byte).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kvtier/block_key.hpp"
#include "runtime/python/py_module.hpp"

namespace kvtier::python {

namespace {

[[noreturn]] void throw_out_of_range(std::size_t i, const std::string& value) {
  throw StatusError(invalid_argument("tokens[" + std::to_string(i) + "] is " + value +
                                     "; token ids are in [0, 2^32)"));
}

// Python objects one by one: a list or tuple, or an object array. Any int is taken (NumPy ints
// too, through __index__), so a value too large for int64 is reported as it is; bool is not.
std::vector<uint32_t> tokens_from_objects(py::handle sequence) {
  std::vector<uint32_t> out;
  out.reserve(py::len(sequence));
  for (py::handle item : sequence) {
    const std::size_t i = out.size();
    if (PyBool_Check(item.ptr()) || !PyIndex_Check(item.ptr())) {
      throw py::type_error("tokens[" + std::to_string(i) + "] is a " + type_name(item) +
                           "; tokens must be integers");
    }
    const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(item.ptr()));
    if (!index) throw py::error_already_set();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    if (overflow != 0 || v < 0 || v > static_cast<long long>(UINT32_MAX)) {
      throw_out_of_range(i, py::str(index));
    }
    out.push_back(static_cast<uint32_t>(v));
  }
  return out;
}

// An integer array through its own signedness: uint64 values above 2^63 stay what they are.
template <typename Wide>
std::vector<uint32_t> tokens_from_integers(const py::array& any) {
  auto values = py::array_t<Wide, py::array::c_style | py::array::forcecast>::ensure(any);
  if (!values) throw py::error_already_set();
  std::vector<uint32_t> out(static_cast<std::size_t>(values.size()));
  const Wide* data = values.data();
  for (std::size_t i = 0; i < out.size(); ++i) {
    bool negative = false;
    if constexpr (std::is_signed_v<Wide>) negative = data[i] < 0;
    if (negative || data[i] > static_cast<Wide>(UINT32_MAX)) {
      throw_out_of_range(i, std::to_string(data[i]));
    }
    out[i] = static_cast<uint32_t>(data[i]);
  }
  return out;
}

// lo or hi of a pickled BlockKey: TypeError for what is not an int, ValueError out of range.
uint64_t key_half(py::handle v, const char* name) {
  if (!PyLong_Check(v.ptr())) {
    throw py::type_error(std::string("a BlockKey's ") + name + " is a " + type_name(v) +
                         "; (lo, hi) are ints");
  }
  const unsigned long long out = PyLong_AsUnsignedLongLong(v.ptr());
  if (out == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::value_error(std::string("a BlockKey's ") + name + " is " + std::string(py::str(v)) +
                          ", not in [0, 2^64)");
  }
  return out;
}

}  // namespace

std::vector<uint32_t> tokens_from(py::handle tokens) {
  const auto not_a_sequence = [&] {
    return py::type_error(
        "tokens must be a one-dimensional sequence of integers: a list, a tuple, a NumPy array "
        "or a CPU torch tensor (got " +
        type_name(tokens) + ")");
  };
  // Read item by item: NumPy would turn [-1, 2**63] into float64 and [2**64] into objects.
  if (py::isinstance<py::list>(tokens) || py::isinstance<py::tuple>(tokens)) {
    return tokens_from_objects(tokens);
  }
  py::array any = py::array::ensure(tokens);
  if (!any) {
    PyErr_Clear();
    throw not_a_sequence();
  }
  if (any.ndim() == 0) throw not_a_sequence();  // None, a str, a scalar: NumPy makes them 0-d
  if (any.ndim() != 1) {
    throw StatusError(invalid_argument("tokens must be one-dimensional (got " +
                                       std::to_string(any.ndim()) + " dimensions)"));
  }
  if (any.size() == 0) return {};
  switch (any.dtype().kind()) {
    case 'i': return tokens_from_integers<int64_t>(any);
    case 'u': return tokens_from_integers<uint64_t>(any);
    case 'O': return tokens_from_objects(any);
    default:
      throw py::type_error("tokens must be integers (got dtype " +
                           std::string(py::str(any.dtype())) + ")");
  }
}

void register_keys(py::module_& m) {
  py::class_<BlockKey>(m, "BlockKey",
                       "A 128-bit chained content key of one full KV block (lo, hi); the top 16 "
                       "bits of hi are its namespace tag.")
      .def(py::init([](uint64_t lo, uint64_t hi) {
             return BlockKey{lo, hi};
           }),
           py::arg("lo"), py::arg("hi"))
      .def_static(
          "from_hex",
          [](const std::string& hex) {
            if (hex.size() != 32 ||
                hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
              throw StatusError(
                  invalid_argument("\"" + hex + "\" is not a block key: 32 hex digits expected"));
            }
            return BlockKey{std::stoull(hex.substr(16), nullptr, 16),
                            std::stoull(hex.substr(0, 16), nullptr, 16)};
          },
          py::arg("hex"), "The key whose str() is `hex` (32 hex digits, hi then lo).")
      .def_readonly("lo", &BlockKey::lo)
      .def_readonly("hi", &BlockKey::hi)
      .def_property_readonly("namespace_tag", &BlockKey::namespace_tag)
      .def_property_readonly("is_private", &BlockKey::is_private)
      .def("__eq__", [](const BlockKey& a, const BlockKey& b) { return a == b; })
      .def("__ne__", [](const BlockKey& a, const BlockKey& b) { return a != b; })
      .def("__lt__", [](const BlockKey& a, const BlockKey& b) { return a < b; })
      .def("__hash__", [](const BlockKey& k) { return py::hash(py::make_tuple(k.lo, k.hi)); })
      .def("__str__", [](const BlockKey& k) { return to_string(k); })
      .def("__repr__",
           [](const BlockKey& k) { return "kvtier.BlockKey.from_hex('" + to_string(k) + "')"; })
      .def(py::pickle([](const BlockKey& k) { return py::make_tuple(k.lo, k.hi); },
                      [](const py::tuple& t) {
                        if (t.size() != 2) {
                          throw py::type_error(
                              "a BlockKey unpickles from (lo, hi), two ints in [0, 2^64) (got a "
                              "tuple of " +
                              std::to_string(t.size()) + ")");
                        }
                        return BlockKey{key_half(t[0], "lo"), key_half(t[1], "hi")};
                      }));

  m.def(
      "namespace_root", [](const std::string& ns) { return namespace_root(ns); },
      py::arg("key_namespace"), "The chain root of a key namespace.");
  m.def(
      "namespace_tag", [](const std::string& ns) { return namespace_tag(ns); },
      py::arg("key_namespace"), "The 16-bit tag stamped into every key of a namespace.");
  m.def(
      "chain_block_keys",
      [](const std::string& ns, py::handle tokens, uint32_t block_tokens) {
        if (block_tokens == 0) throw StatusError(invalid_argument("block_tokens is 0"));
        const std::vector<uint32_t> t = tokens_from(tokens);
        return chain_block_keys(ns, t, block_tokens);
      },
      py::arg("key_namespace"), py::arg("tokens"), py::arg("block_tokens"),
      "Keys of every full block of `tokens` (len(tokens) // block_tokens of them).");
}

}  // namespace kvtier::python
