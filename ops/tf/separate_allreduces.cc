// A graph pass over tf.function graphs: the separate allreduces of one
// function that do not depend on each other run in one kernel.
//
// Note [separate allreduces in one kernel]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A step with 100 separate `hvdkeras.allreduce` calls costs TensorFlow 100
// async kernels: 100 dispatches and 100 completions, each a few tenths of a
// microsecond of executor work, plus the engine's wake-ups between them.
// Before a function runs, this pass (TensorFlow's PRE_PLACEMENT grouping,
// ahead of control-flow lowering) gathers such ops into one
// `HvdkerasAllreduce` node whose `tensor_names` lists the member nodes'
// names. Its kernel still queues one engine collective per tensor under the
// member's own name, so what the ranks negotiate is exactly what it was
// without the pass: a rank whose graph was merged differently (or not at
// all) still matches, and errors name the same collectives.
//
// Which nodes: one-tensor allreduces named by their node (an empty
// `tensor_name`, the case where every rank traces the same graph; see Note
// [collective names] in hvdkeras/collectives/common.py) with the same dtype,
// reduction, scaling, process set and requested device. Two members must
// not depend on each other, and the merged nodes must not form a cycle, so
// each candidate gets a level, one more than the deepest candidate it
// depends on, and only candidates of one level are merged: every dependency
// between merged nodes then goes from a lower level to a higher one. A
// merged node starts once all its members' inputs are ready, so members whose
// inputs are ready at different times wait for the last; the engine's burst
// gathering (Note [burst gathering] in core/burst_memory.h) already waits
// for ops that ran together, so this costs little beyond that. Graphs with
// lowered control flow (Switch, Merge, frames) are left alone: a member in a
// branch must not hold back the others. Only function graphs are rewritten;
// a session's graph may fetch a node by name. A member that the function
// must run (its control outputs) is kept as a NoOp of the same name that
// waits for the merged node. HVDKERAS_MERGE_SEPARATE_ALLREDUCES=0 turns the
// pass off (hvdkeras/engine/config.py names the variable).

// TensorFlow's graph classes have another layout without NDEBUG (an edge set
// counts its mutations in debug builds); the pip package is a release build,
// and this file walks its graphs' edges.
#ifndef NDEBUG
#define NDEBUG
#endif

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/graph/algorithm.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/graph/node_builder.h"

namespace tf = tensorflow;

namespace hvdkeras {
namespace {

constexpr char kAllreduce[] = "HvdkerasAllreduce";
constexpr char kSwitchVariable[] = "HVDKERAS_MERGE_SEPARATE_ALLREDUCES";

bool Enabled() {
  const char* value = std::getenv(kSwitchVariable);
  return value == nullptr || std::string(value) != "0";
}

// What members of one merged node must share.
struct MergeKey {
  int level;
  tf::DataType dtype;
  int64_t reduce_op;
  float prescale;
  float postscale;
  int64_t process_set;
  std::string device;
  bool operator<(const MergeKey& o) const {
    return std::tie(level, dtype, reduce_op, prescale, postscale, process_set, device) <
           std::tie(o.level, o.dtype, o.reduce_op, o.prescale, o.postscale, o.process_set,
                    o.device);
  }
};

// Whether `node` is a one-tensor allreduce named by its node; fills in its key
// (level aside).
bool IsCandidate(const tf::Node* node, MergeKey* key) {
  if (node->type_string() != kAllreduce) return false;
  const tf::AttrSlice attrs = node->attrs();
  int64_t n = 0;
  std::string tensor_name;
  // N == 1 also rules out nodes this pass made (they carry two or more).
  if (!tf::TryGetNodeAttr(attrs, "N", &n) || n != 1) return false;
  if (!tf::TryGetNodeAttr(attrs, "tensor_name", &tensor_name) || !tensor_name.empty()) {
    return false;
  }
  if (attrs.Find("_class") != nullptr) return false;  // colocation constraints
  if (!tf::TryGetNodeAttr(attrs, "T", &key->dtype) ||
      !tf::TryGetNodeAttr(attrs, "reduce_op", &key->reduce_op) ||
      !tf::TryGetNodeAttr(attrs, "prescale_factor", &key->prescale) ||
      !tf::TryGetNodeAttr(attrs, "postscale_factor", &key->postscale)) {
    return false;
  }
  key->process_set = 0;
  tf::TryGetNodeAttr(attrs, "process_set_id", &key->process_set);
  key->device = node->requested_device();
  return true;
}

// The data input of a one-tensor allreduce.
const tf::Edge* DataInput(const tf::Node* node) {
  for (const tf::Edge* e : node->in_edges()) {
    if (!e->IsControlEdge() && e->dst_input() == 0) return e;
  }
  return nullptr;
}

absl::Status Merge(tf::Graph* graph, const std::vector<tf::Node*>& members,
                   const MergeKey& key, const std::set<std::string>& must_run) {
  std::vector<tf::NodeBuilder::NodeOut> inputs;
  std::vector<std::string> names;
  for (tf::Node* member : members) {
    const tf::Edge* in = DataInput(member);
    if (in == nullptr) return absl::OkStatus();  // malformed: leave the graph as it is
    inputs.emplace_back(in->src(), in->src_output());
    names.push_back(member->name());
  }
  const int n = static_cast<int>(members.size());
  tf::Node* merged = nullptr;
  TF_RETURN_IF_ERROR(
      tf::NodeBuilder(graph->NewName(members.front()->name() + "/hvdkeras_merged"), kAllreduce)
          .Input(inputs)
          .Attr("T", key.dtype)
          .Attr("N", n)
          .Attr("reduce_op", key.reduce_op)
          .Attr("prescale_factor", key.prescale)
          .Attr("postscale_factor", key.postscale)
          .Attr("tensor_name", "")
          .Attr("process_set_id", key.process_set)
          .Attr("tensor_names", names)
          .Device(key.device)
          .Finalize(graph, &merged));
  // One consumer of the outputs (as `one_consumer` in
  // hvdkeras/collectives/kernels.py does for a multi-output collective).
  std::vector<tf::NodeBuilder::NodeOut> outputs;
  std::vector<tf::DataType> types(n, key.dtype);
  for (int i = 0; i < n; ++i) outputs.emplace_back(merged, i);
  tf::Node* identity = nullptr;
  TF_RETURN_IF_ERROR(tf::NodeBuilder(graph->NewName(merged->name() + "/outputs"), "IdentityN")
                         .Input(outputs)
                         .Attr("T", types)
                         .Device(key.device)
                         .Finalize(graph, &identity));
  for (int i = 0; i < n; ++i) {
    tf::Node* member = members[i];
    std::vector<const tf::Edge*> in_edges, out_edges;
    for (const tf::Edge* e : member->in_edges()) in_edges.push_back(e);
    for (const tf::Edge* e : member->out_edges()) out_edges.push_back(e);
    for (const tf::Edge* e : in_edges) {
      if (e->IsControlEdge()) graph->AddControlEdge(e->src(), merged, true);
    }
    for (const tf::Edge* e : out_edges) {
      if (e->IsControlEdge()) {
        graph->AddControlEdge(identity, e->dst(), true);
      } else {
        graph->AddEdge(identity, i, e->dst(), e->dst_input());
      }
    }
    const std::string name = member->name();
    graph->RemoveNode(member);
    if (must_run.count(name)) {
      tf::Node* stand_in = nullptr;
      TF_RETURN_IF_ERROR(tf::NodeBuilder(name, "NoOp")
                             .ControlInput(identity)
                             .Device(key.device)
                             .Finalize(graph, &stand_in));
    }
  }
  return absl::OkStatus();
}

class MergeSeparateAllreduces : public tf::GraphOptimizationPass {
 public:
  absl::Status Run(const tf::GraphOptimizationPassOptions& options) override {
    if (!options.is_function_graph || options.graph == nullptr || !Enabled()) {
      return absl::OkStatus();
    }
    tf::Graph* graph = options.graph->get();
    if (graph == nullptr) return absl::OkStatus();
    bool any = false;
    for (const tf::Node* node : graph->op_nodes()) {
      if (node->IsControlFlow()) return absl::OkStatus();
      any = any || node->type_string() == kAllreduce;
    }
    if (!any) return absl::OkStatus();

    // Levels, in topological order: a candidate's level is one more than the
    // deepest candidate among its ancestors (data and control edges alike).
    std::vector<tf::Node*> order;
    tf::GetReversePostOrder(*graph, &order);
    std::unordered_map<const tf::Node*, int> depth;  // deepest candidate at or above
    std::map<MergeKey, std::vector<tf::Node*>> groups;
    for (tf::Node* node : order) {
      int above = 0;
      for (const tf::Edge* e : node->in_edges()) {
        auto it = depth.find(e->src());
        if (it != depth.end() && it->second > above) above = it->second;
      }
      MergeKey key;
      if (IsCandidate(node, &key)) {
        key.level = above + 1;
        depth[node] = key.level;
        groups[key].push_back(node);
      } else {
        depth[node] = above;
      }
    }
    std::set<std::string> must_run;
    if (options.function_def != nullptr) {
      for (const auto& entry : options.function_def->control_ret()) must_run.insert(entry.second);
    }
    for (const auto& [key, members] : groups) {
      if (members.size() < 2) continue;
      TF_RETURN_IF_ERROR(Merge(graph, members, key, must_run));
    }
    return absl::OkStatus();
  }
};

// Phase 1 of PRE_PLACEMENT: before TensorFlow lowers If/While into frames.
REGISTER_OPTIMIZATION(tf::OptimizationPassRegistry::PRE_PLACEMENT, 1, MergeSeparateAllreduces);

}  // namespace
}  // namespace hvdkeras
