// Element types between TensorFlow and the engine, derived from the engine's
// table (see Note [wire vocabulary] in core/types.def): no type is listed
// here by hand.
#pragma once

#include <string>

#include "core/common.h"
#include "tensorflow/core/framework/types.h"

namespace hvdkeras {

// The engine's type for a TensorFlow type; false when the engine has none.
inline bool ToEngineType(tensorflow::DataType dtype, DataType* out) {
  switch (dtype) {
#define HVDKERAS_DTYPE(enumerator, value, name, bytes, reducible, floating, tensorflow_type) \
  case tensorflow::DT_##tensorflow_type:                                                     \
    *out = DataType::enumerator;                                                             \
    return true;
#include "core/types.def"
    default:
      return false;
  }
}

enum class TypeSet { kReducible, kAny };

// A type attribute for REGISTER_OP: "T: {uint8, int8, ...}" (or
// "T: list({...})") with the TensorFlow names of the engine's types.
inline std::string TypeAttr(const char* attr, TypeSet set, bool list = false) {
  std::string types;
#define HVDKERAS_DTYPE(enumerator, value, name, bytes, reducible, floating, tensorflow_type) \
  if (set == TypeSet::kAny || (reducible)) {                                                 \
    if (!types.empty()) types += ", ";                                                       \
    types += tensorflow::DataTypeString(tensorflow::DT_##tensorflow_type);                   \
  }
#include "core/types.def"
  return std::string(attr) + (list ? ": list({" + types + "})" : ": {" + types + "}");
}

}  // namespace hvdkeras
