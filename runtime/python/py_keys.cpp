// kvtier.BlockKey and the key helpers that need no runtime. A BlockKey is an immutable, hashable,
// picklable value equal to the C++ BlockKey field for field (lo, hi as unsigned 64-bit ints), so
// keys computed in one process are valid in another (the hash is fixed byte for byte).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "kvtier/block_key.hpp"
#include "runtime/python/py_module.hpp"

namespace kvtier::python {

std::vector<uint32_t> tokens_from(py::handle tokens) {
  py::array any = py::array::ensure(tokens);
  if (!any) {
    PyErr_Clear();
    throw py::type_error("tokens must be a sequence of integers (got " +
                         std::string(py::str(py::type::handle_of(tokens))) + ")");
  }
  if (any.ndim() != 1) {
    throw StatusError(invalid_argument("tokens must be one-dimensional (got " +
                                       std::to_string(any.ndim()) + " dimensions)"));
  }
  const char kind = any.dtype().kind();
  if (any.size() > 0 && kind != 'i' && kind != 'u') {
    throw py::type_error("tokens must be integers (got dtype " + std::string(py::str(any.dtype())) +
                         ")");
  }
  auto values = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(any);
  if (!values) throw py::error_already_set();
  std::vector<uint32_t> out(static_cast<std::size_t>(values.size()));
  const int64_t* data = values.data();
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (data[i] < 0 || data[i] > static_cast<int64_t>(UINT32_MAX)) {
      throw StatusError(invalid_argument("tokens[" + std::to_string(i) + "] is " +
                                         std::to_string(data[i]) + "; token ids are in [0, 2^32)"));
    }
    out[i] = static_cast<uint32_t>(data[i]);
  }
  return out;
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
                        if (t.size() != 2)
                          throw std::runtime_error("a BlockKey pickles as (lo, hi)");
                        return BlockKey{t[0].cast<uint64_t>(), t[1].cast<uint64_t>()};
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
