#include "cuda/cuda_libraries.h"

#include <dirent.h>
#include <dlfcn.h>
#include <link.h>

#include <mutex>
#include <sstream>
#include <vector>

namespace hvdkeras {
namespace cuda {

namespace {

// Each library's names, the one preferred first. CUDA 12 is what
// TensorFlow's wheels use; CUDA 13 is what current PyTorch and JAX wheels
// bring (the functions used here kept their signatures). A process that
// already loaded one (its framework's) keeps it, whatever the order.
constexpr const char* kRuntimeNames = "libcudart.so.12:libcudart.so.13";
constexpr const char* kDriverNames = "libcuda.so.1";
constexpr const char* kNvrtcNames = "libnvrtc.so.12:libnvrtc.so.13";
constexpr const char* kNcclNames = "libnccl.so.2";

std::vector<std::string> Split(const std::string& names) {
  std::vector<std::string> out;
  std::stringstream in(names);
  std::string name;
  while (std::getline(in, name, ':')) {
    if (!name.empty()) out.push_back(name);
  }
  return out;
}

std::mutex& LoaderMutex() {
  static std::mutex mu;
  return mu;
}

std::vector<std::string>& LibraryDirs() {
  static std::vector<std::string> dirs;
  return dirs;
}

// A library the process already has (its framework's own) under any of
// its names, else the first found in the given directories, else the
// dynamic loader's search, each name in turn.
void* Open(const char* sonames, std::string* why) {
  const std::vector<std::string> names = Split(sonames);
  for (const std::string& name : names) {
    if (void* loaded = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD)) return loaded;
  }
  for (const std::string& name : names) {
    for (const std::string& dir : LibraryDirs()) {
      const std::string path = dir + "/" + name;
      if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) return handle;
    }
  }
  std::string errors;
  for (const std::string& name : names) {
    if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL)) return handle;
    const char* error = dlerror();
    errors += (errors.empty() ? "" : "; ") + std::string(error ? error : name + ": not found");
  }
  *why = std::string(sonames) + " not found (" + errors + ")";
  return nullptr;
}

// Loads a library once and fills its table with `fill`; the outcome (the
// table or the reason) is kept for every later call.
template <typename Table, typename Fill>
const Table* LoadOnce(const char* soname, std::string* why, Fill fill) {
  static Table table;
  static bool tried = false;
  static const Table* loaded = nullptr;
  static std::string reason;
  std::lock_guard<std::mutex> lock(LoaderMutex());
  if (!tried) {
    tried = true;
    if (void* handle = Open(soname, &reason)) {
      std::string missing;
      fill(handle, &table, &missing);
      if (missing.empty()) {
        loaded = &table;
      } else {
        reason = std::string(soname) + " lacks " + missing + " (too old?)";
      }
    }
  }
  if (loaded == nullptr && why != nullptr) *why = reason;
  return loaded;
}

void* Find(void* handle, const char* name, std::string* missing) {
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr && missing->empty()) *missing = name;
  return symbol;
}

#define HVDKERAS_STRINGIFY(x) #x
#define HVDKERAS_NAME_OF(x) HVDKERAS_STRINGIFY(x)
#define HVDKERAS_FIND(name) \
  t->name = reinterpret_cast<decltype(t->name)>(Find(handle, HVDKERAS_NAME_OF(name), missing));
#define HVDKERAS_FIND_TYPED(name, type) HVDKERAS_FIND(name)

}  // namespace

void SetLibraryDirs(const std::string& dirs) {
  std::lock_guard<std::mutex> lock(LoaderMutex());
  std::vector<std::string>& out = LibraryDirs();
  out.clear();
  std::stringstream in(dirs);
  std::string dir;
  while (std::getline(in, dir, ':')) {
    if (!dir.empty()) out.push_back(dir);
  }
}

const Runtime* LoadRuntime(std::string* why) {
  return LoadOnce<Runtime>(kRuntimeNames, why, [](void* handle, Runtime* t, std::string* missing) {
    HVDKERAS_RUNTIME_FUNCTIONS(HVDKERAS_FIND)
    HVDKERAS_RUNTIME_OVERLOADED(HVDKERAS_FIND_TYPED)
  });
}

const Driver* LoadDriver(std::string* why) {
  return LoadOnce<Driver>(kDriverNames, why, [](void* handle, Driver* t, std::string* missing) {
    HVDKERAS_DRIVER_FUNCTIONS(HVDKERAS_FIND)
  });
}

namespace {

// NVRTC opens its builtins library (libnvrtc-builtins.so.<version>) by name
// when it first compiles; loaded from a pip wheel's folder, which is on no
// search path, that lookup fails and so would every GPU collective. Opening
// it first from NVRTC's own folder makes the later lookup find it loaded.
void PreloadNvrtcBuiltins(void* nvrtc) {
  link_map* map = nullptr;
  if (dlinfo(nvrtc, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr || map->l_name == nullptr) {
    return;
  }
  const std::string path = map->l_name;
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return;
  const std::string dir = path.substr(0, slash);
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) return;
  const std::string prefix = "libnvrtc-builtins.so";
  std::string found;
  while (dirent* entry = readdir(listing)) {
    const std::string name = entry->d_name;
    // The versioned name (libnvrtc-builtins.so.12.5) is the one asked for.
    if (name.compare(0, prefix.size(), prefix) == 0 && name.size() > found.size()) found = name;
  }
  closedir(listing);
  if (!found.empty()) dlopen((dir + "/" + found).c_str(), RTLD_NOW | RTLD_GLOBAL);
}

}  // namespace

const Nvrtc* LoadNvrtc(std::string* why) {
  return LoadOnce<Nvrtc>(kNvrtcNames, why, [](void* handle, Nvrtc* t, std::string* missing) {
    HVDKERAS_NVRTC_FUNCTIONS(HVDKERAS_FIND)
    if (missing->empty()) PreloadNvrtcBuiltins(handle);
  });
}

const Nccl* LoadNccl(std::string* why) {
  return LoadOnce<Nccl>(kNcclNames, why, [](void* handle, Nccl* t, std::string* missing) {
    HVDKERAS_NCCL_FUNCTIONS(HVDKERAS_FIND)
  });
}

std::string LoadedFrom(const char* soname) {
  void* handle = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return "";
  link_map* map = nullptr;
  std::string path;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) {
    path = map->l_name;
  }
  dlclose(handle);
  return path;
}

}  // namespace cuda
}  // namespace hvdkeras
