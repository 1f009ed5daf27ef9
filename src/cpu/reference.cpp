// placeholder until the CPU backend lands
#include "cpu/cpu_backend.hpp"
#include "flashcpp/error.hpp"
namespace flashcpp::detail::cpu {
void reference_forward(const ForwardParams&) { throw Error("cpu reference: not implemented yet"); }
void reference_backward(const BackwardParams&) { throw Error("cpu reference: not implemented yet"); }
void tiled_forward(const ForwardParams&) { throw Error("cpu backend: not implemented yet"); }
void tiled_backward(const BackwardParams&) { throw Error("cpu backend: not implemented yet"); }
const char* tiled_kernel_name() { return "cpu_tiled"; }
}  // namespace flashcpp::detail::cpu
