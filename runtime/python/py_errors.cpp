// kvtier.Error and one subclass per status code, each also deriving from the built-in exception a
// Python caller would reach for (NotFoundError is a LookupError, DeadlineExceededError a
// TimeoutError, ...), so `except KeyError`-style code keeps working while `except kvtier.Error`
// catches everything kvtier raises. The message is the Status message; `.code` is the code's
// stable name ("not_found").
#include <array>

#include "runtime/python/py_module.hpp"

namespace kvtier::python {
namespace {

struct ErrorClass {
  StatusCode code;
  const char* name;
  PyObject* builtin;  // the second base, or nullptr
};

// Set once at import, read by the translator (which runs with the GIL held).
std::array<PyObject*, static_cast<int>(StatusCode::kInternal) + 1> g_classes{};
PyObject* g_base = nullptr;

// `code` is the class's stable code name; None on the base class.
PyObject* new_class(const std::string& name, PyObject* bases, const char* code) {
  py::dict attrs;
  attrs["code"] = code != nullptr ? py::object(py::str(code)) : py::object(py::none());
  PyObject* cls = PyErr_NewException(("kvtier." + name).c_str(), bases, attrs.ptr());
  if (cls == nullptr) throw py::error_already_set();
  return cls;
}

}  // namespace

void register_errors(py::module_& m) {
  const ErrorClass classes[] = {
      {StatusCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError},
      {StatusCode::kNotFound, "NotFoundError", PyExc_LookupError},
      {StatusCode::kAlreadyExists, "AlreadyExistsError", nullptr},
      {StatusCode::kFailedPrecondition, "FailedPreconditionError", PyExc_RuntimeError},
      {StatusCode::kResourceExhausted, "ResourceExhaustedError", nullptr},
      {StatusCode::kOutOfRange, "OutOfRangeError", PyExc_IndexError},
      {StatusCode::kIoError, "IoError", PyExc_OSError},
      {StatusCode::kDataLoss, "DataLossError", nullptr},
      {StatusCode::kDeadlineExceeded, "DeadlineExceededError", PyExc_TimeoutError},
      {StatusCode::kCancelled, "CancelledError", nullptr},
      {StatusCode::kUnavailable, "UnavailableError", nullptr},
      {StatusCode::kInternal, "InternalError", PyExc_RuntimeError},
  };
  g_base = new_class("Error", PyExc_Exception, nullptr);
  m.attr("Error") = py::handle(g_base);
  for (const ErrorClass& c : classes) {
    py::tuple bases = c.builtin != nullptr
                          ? py::tuple(py::make_tuple(py::handle(g_base), py::handle(c.builtin)))
                          : py::tuple(py::make_tuple(py::handle(g_base)));
    PyObject* cls = new_class(c.name, bases.ptr(), status_code_name(c.code).data());
    g_classes[static_cast<int>(c.code)] = cls;
    m.attr(c.name) = py::handle(cls);
  }

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const int i = static_cast<int>(e.code());
      PyObject* cls = i >= 0 && i < static_cast<int>(g_classes.size()) && g_classes[i] != nullptr
                          ? g_classes[i]
                          : g_base;
      PyErr_SetString(cls, e.what());
    }
  });
}

}  // namespace kvtier::python
