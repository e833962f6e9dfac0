// An experiment, not part of Veil (see README.md here): a gRPC server in C++ that gathers the raw
// requests in flight and hands each gathered set to one Python callable, taking the GIL once per
// set, then answers every call. grpcio's sync server instead takes a thread hand-off and GIL
// round trips per call (bench/PROFILES.md section 4), which is what keeps its handler slow.
// Any method is answered through the callable: this serves Collector/Upload and nothing else.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/generic/async_generic_service.h>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

class Call;
static std::mutex mu;
static std::condition_variable cv;
static std::deque<Call*> inbox;

class Call : public grpc::ServerGenericBidiReactor {
 public:
  Call() { StartRead(&request_); }
  void OnReadDone(bool ok) override {
    if (!ok) { Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request")); return; }
    std::vector<grpc::Slice> slices;
    request_.Dump(&slices);
    for (auto& s : slices) data.append(reinterpret_cast<const char*>(s.begin()), s.size());
    { std::lock_guard<std::mutex> l(mu); inbox.push_back(this); }
    cv.notify_one();
  }
  void Answer(std::string& body) {
    grpc::Slice s(body);
    response_ = grpc::ByteBuffer(&s, 1);
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void Fail() { Finish(grpc::Status(grpc::StatusCode::INTERNAL, "handler failed")); }
  void OnWriteDone(bool) override {}
  void OnDone() override { delete this; }
  std::string data;
 private:
  grpc::ByteBuffer request_, response_;
};

class Front : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override { return new Call(); }
};

// serve(port_file, handler, most): listen on a free loopback port, write it to port_file, then
// call handler(list of request bytes) -> list of response bytes, with at most `most` a call,
// until a signal handler raises (Ctrl-C). A handler that raises fails its set with INTERNAL.
static PyObject* serve(PyObject*, PyObject* args) {
  const char* port_file; PyObject* handler; int most;
  if (!PyArg_ParseTuple(args, "sOi", &port_file, &handler, &most)) return nullptr;
  Front front;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(&front);
  auto server = builder.BuildAndStart();
  std::ofstream(port_file) << port;
  std::vector<Call*> taken;
  std::vector<std::string> answers;
  for (;;) {
    Py_BEGIN_ALLOW_THREADS
    {
      std::unique_lock<std::mutex> l(mu);
      cv.wait_for(l, std::chrono::milliseconds(200), [] { return !inbox.empty(); });
      while (!inbox.empty() && (int)taken.size() < most) { taken.push_back(inbox.front()); inbox.pop_front(); }
    }
    Py_END_ALLOW_THREADS
    if (PyErr_CheckSignals() != 0) break;
    if (taken.empty()) continue;
    PyObject* list = PyList_New(taken.size());
    for (size_t i = 0; i < taken.size(); i++)
      PyList_SET_ITEM(list, i, PyBytes_FromStringAndSize(taken[i]->data.data(), taken[i]->data.size()));
    PyObject* out = PyObject_CallOneArg(handler, list);
    Py_DECREF(list);
    bool ok = out && PyList_Check(out) && PyList_GET_SIZE(out) == (Py_ssize_t)taken.size();
    answers.clear();
    if (ok) {
      for (size_t i = 0; i < taken.size(); i++) {
        PyObject* b = PyList_GET_ITEM(out, i);
        if (!PyBytes_Check(b)) { ok = false; break; }
        answers.emplace_back(PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
      }
    }
    if (!out) PyErr_Print();
    Py_XDECREF(out);
    Py_BEGIN_ALLOW_THREADS
    for (size_t i = 0; i < taken.size(); i++) { if (ok) taken[i]->Answer(answers[i]); else taken[i]->Fail(); }
    Py_END_ALLOW_THREADS
    taken.clear();
  }
  server->Shutdown();
  return nullptr;
}

static PyMethodDef methods[] = {{"serve", serve, METH_VARARGS, "serve(port_file, handler, most)"}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_front", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_native_front() { return PyModule_Create(&module); }
