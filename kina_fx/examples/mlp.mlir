// A two-layer MLP with softmax cross-entropy whose every tensor op is a runtime
// call, differentiated by an autograd tape that this module drives itself
// (docs/autograd-abi.md).
//
//   loss = cross_entropy(relu(x @ w1 + b1) @ w2 + b2, labels)
//
// x: N x D, w1: D x H, b1: H, w2: H x C, b2: C, labels: N (int64), loss: rank 0.
//
// Exports (llvm.emit_c_interface: each memref is passed as a pointer to its
// ranked descriptor, kina_memref_descriptor_t in kina_fx.h):
//   @mlp_loss          the forward pass, all six ops runtime calls
//   @mlp_loss_loops    the same with relu computed by linalg loops: invisible to
//                      a tape, which strict mode reports
//   @mlp_grads         loss and d loss / d (w1, b1, w2, b2) through a tape
//   @mlp_grads_loops   the same around @mlp_loss_loops (fails in strict mode)
//   @mlp_problem       fills a deterministic problem of any size
//   @relu_any          relu over unranked memrefs (kina_unranked_memref_t *)
//   @scale_in_place    x *= w, loss = sum(x): an argument updated in place
//   @read_then_clear   loss = sum(x * w), then x = 0 by a loop
//   @main              for mlir-cpu-runner-19: N=6, D=4, H=5, C=3; prints the
//                      gradients, a checksum, and the tape's error reports
// Every function returns the first non-zero status it met (KINA_STATUS_*).
// Shipped with kina_fx (kina_fx.compiled.example_path("mlp.mlir")): `kina-fx
// demo` and benches/bench_compiled_step.py compile it with
// kina_fx.compiled.compile_mlir; tests/hosts/mlir/test_mlir_tape.py lowers it,
// links it against libkina_fx.so (Python and C hosts) and runs @main under the JIT.

!m2 = memref<?x?xf32, strided<[?, ?], offset: ?>>
!m1 = memref<?xf32, strided<[?], offset: ?>>
!l1 = memref<?xi64, strided<[?], offset: ?>>
!m0 = memref<f32, strided<[], offset: ?>>
!forward = (!m0, !m2, !l1, !m2, !m1, !m2, !m1) -> i32

module {
  // ---- the runtime ops this module uses (kina_fx.h) ----
  func.func private @runtime_gpu_matmul_f32(memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32 attributes {llvm.emit_c_interface}
  func.func private @runtime_add_f32(memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32 attributes {llvm.emit_c_interface}
  func.func private @runtime_relu_f32(memref<*xf32>, memref<*xf32>) -> i32 attributes {llvm.emit_c_interface}
  func.func private @runtime_mul_f32(memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32 attributes {llvm.emit_c_interface}
  func.func private @runtime_sum_f32(memref<*xf32>, memref<*xf32>, i32, i32) -> i32 attributes {llvm.emit_c_interface}
  func.func private @runtime_cross_entropy_f32(memref<*xf32>, memref<*xf32>, memref<*xi64>) -> i32 attributes {llvm.emit_c_interface}

  // ---- the tape ABI in its MLIR form: the handle is an i64 ----
  func.func private @kina_tape_begin(memref<*xi64>, i32) -> i32 attributes {llvm.emit_c_interface}
  func.func private @kina_tape_watch_f32(i64, memref<*xf32>) -> i32 attributes {llvm.emit_c_interface}
  func.func private @kina_tape_constant_f32(i64, memref<*xf32>) -> i32 attributes {llvm.emit_c_interface}
  func.func private @kina_tape_constant_i64(i64, memref<*xi64>) -> i32 attributes {llvm.emit_c_interface}
  func.func private @kina_tape_backward_f32(i64, memref<*xf32>, memref<*xf32>) -> i32 attributes {llvm.emit_c_interface}
  func.func private @kina_tape_grad_f32(i64, memref<*xf32>, memref<*xf32>) -> i32 attributes {llvm.emit_c_interface}
  // No memref operand: declared without emit_c_interface (it would rename the callee).
  func.func private @kina_tape_end(i64) -> i32
  func.func private @kina_tape_free(i64) -> i32

  // ---- the forward pass ----
  // Intermediates live in memref.alloc buffers freed before returning: the tape
  // has kept what backward needs.  A failing op ends the pass (its
  // kina_last_error stays the one the caller sees).
  func.func private @mlp_forward(%relu_by_loops: i1, %loss: !m0, %x: !m2, %labels: !l1,
                                 %w1: !m2, %b1: !m1, %w2: !m2, %b2: !m1) -> i32 {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %ok = arith.constant 0 : i32
    %n = memref.dim %x, %c0 : !m2
    %h = memref.dim %w1, %c1 : !m2
    %k = memref.dim %w2, %c1 : !m2
    %z1 = memref.alloc(%n, %h) : memref<?x?xf32>
    %a1 = memref.alloc(%n, %h) : memref<?x?xf32>
    %r1 = memref.alloc(%n, %h) : memref<?x?xf32>
    %z2 = memref.alloc(%n, %k) : memref<?x?xf32>
    %logits = memref.alloc(%n, %k) : memref<?x?xf32>
    %ux = memref.cast %x : !m2 to memref<*xf32>
    %uw1 = memref.cast %w1 : !m2 to memref<*xf32>
    %ub1 = memref.cast %b1 : !m1 to memref<*xf32>
    %uw2 = memref.cast %w2 : !m2 to memref<*xf32>
    %ub2 = memref.cast %b2 : !m1 to memref<*xf32>
    %ulabels = memref.cast %labels : !l1 to memref<*xi64>
    %uloss = memref.cast %loss : !m0 to memref<*xf32>
    %uz1 = memref.cast %z1 : memref<?x?xf32> to memref<*xf32>
    %ua1 = memref.cast %a1 : memref<?x?xf32> to memref<*xf32>
    %ur1 = memref.cast %r1 : memref<?x?xf32> to memref<*xf32>
    %uz2 = memref.cast %z2 : memref<?x?xf32> to memref<*xf32>
    %ulogits = memref.cast %logits : memref<?x?xf32> to memref<*xf32>

    %s1 = call @runtime_gpu_matmul_f32(%uz1, %ux, %uw1) : (memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32
    %ok1 = arith.cmpi eq, %s1, %ok : i32
    cf.cond_br %ok1, ^bias1, ^done(%s1 : i32)
  ^bias1:
    %s2 = call @runtime_add_f32(%ua1, %uz1, %ub1) : (memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32
    %ok2 = arith.cmpi eq, %s2, %ok : i32
    cf.cond_br %ok2, ^relu, ^done(%s2 : i32)
  ^relu:
    %s3 = scf.if %relu_by_loops -> i32 {
      // What a compiler does when it fuses or inlines an op: no runtime call,
      // so no tape sees it.
      linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                      iterator_types = ["parallel", "parallel"]}
          ins(%a1 : memref<?x?xf32>) outs(%r1 : memref<?x?xf32>) {
      ^bb0(%v: f32, %unused: f32):
        %zero = arith.constant 0.0 : f32
        %r = arith.maximumf %v, %zero : f32
        linalg.yield %r : f32
      }
      scf.yield %ok : i32
    } else {
      %s = func.call @runtime_relu_f32(%ur1, %ua1) : (memref<*xf32>, memref<*xf32>) -> i32
      scf.yield %s : i32
    }
    %ok3 = arith.cmpi eq, %s3, %ok : i32
    cf.cond_br %ok3, ^layer2, ^done(%s3 : i32)
  ^layer2:
    %s4 = call @runtime_gpu_matmul_f32(%uz2, %ur1, %uw2) : (memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32
    %ok4 = arith.cmpi eq, %s4, %ok : i32
    cf.cond_br %ok4, ^bias2, ^done(%s4 : i32)
  ^bias2:
    %s5 = call @runtime_add_f32(%ulogits, %uz2, %ub2) : (memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32
    %ok5 = arith.cmpi eq, %s5, %ok : i32
    cf.cond_br %ok5, ^cross_entropy, ^done(%s5 : i32)
  ^cross_entropy:
    %s6 = call @runtime_cross_entropy_f32(%uloss, %ulogits, %ulabels) : (memref<*xf32>, memref<*xf32>, memref<*xi64>) -> i32
    cf.br ^done(%s6 : i32)
  ^done(%status: i32):
    memref.dealloc %z1 : memref<?x?xf32>
    memref.dealloc %a1 : memref<?x?xf32>
    memref.dealloc %r1 : memref<?x?xf32>
    memref.dealloc %z2 : memref<?x?xf32>
    memref.dealloc %logits : memref<?x?xf32>
    return %status : i32
  }

  func.func @mlp_loss(%loss: !m0, %x: !m2, %labels: !l1, %w1: !m2, %b1: !m1, %w2: !m2, %b2: !m1) -> i32
      attributes {llvm.emit_c_interface} {
    %false = arith.constant false
    %s = call @mlp_forward(%false, %loss, %x, %labels, %w1, %b1, %w2, %b2) : (i1, !m0, !m2, !l1, !m2, !m1, !m2, !m1) -> i32
    return %s : i32
  }

  func.func @mlp_loss_loops(%loss: !m0, %x: !m2, %labels: !l1, %w1: !m2, %b1: !m1, %w2: !m2, %b2: !m1) -> i32
      attributes {llvm.emit_c_interface} {
    %true = arith.constant true
    %s = call @mlp_forward(%true, %loss, %x, %labels, %w1, %b1, %w2, %b2) : (i1, !m0, !m2, !l1, !m2, !m1, !m2, !m1) -> i32
    return %s : i32
  }

  // An export over unranked memrefs (its C interface takes kina_unranked_memref_t *,
  // the other form kina_fx.compiled passes): out = relu(x) for any shape.
  func.func @relu_any(%out: memref<*xf32>, %x: memref<*xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %s = call @runtime_relu_f32(%out, %x) : (memref<*xf32>, memref<*xf32>) -> i32
    return %s : i32
  }

  // An export that updates an argument in place: x *= w, then loss = sum(x).
  // d loss / d w is the x it was called with, which the tape must have kept.
  func.func @scale_in_place(%loss: memref<*xf32>, %x: memref<*xf32>, %w: memref<*xf32>) -> i32
      attributes {llvm.emit_c_interface} {
    %ok = arith.constant 0 : i32
    %all = arith.constant -2147483648 : i32  // KINA_ALL_AXES
    %keepdims = arith.constant 0 : i32
    %s1 = call @runtime_mul_f32(%x, %x, %w) : (memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32
    %ok1 = arith.cmpi eq, %s1, %ok : i32
    cf.cond_br %ok1, ^sum, ^done(%s1 : i32)
  ^sum:
    %s2 = call @runtime_sum_f32(%loss, %x, %all, %keepdims) : (memref<*xf32>, memref<*xf32>, i32, i32) -> i32
    cf.br ^done(%s2 : i32)
  ^done(%status: i32):
    return %status : i32
  }

  // An export that reads an argument with a runtime op, then clears it with a
  // loop: loss = sum(x * w); x = 0.  d loss / d w is the x that was read.
  func.func @read_then_clear(%loss: memref<*xf32>, %x: memref<?xf32>, %w: memref<*xf32>) -> i32
      attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %ok = arith.constant 0 : i32
    %all = arith.constant -2147483648 : i32  // KINA_ALL_AXES
    %keepdims = arith.constant 0 : i32
    %zero = arith.constant 0.0 : f32
    %n = memref.dim %x, %c0 : memref<?xf32>
    %p = memref.alloc(%n) : memref<?xf32>
    %up = memref.cast %p : memref<?xf32> to memref<*xf32>
    %ux = memref.cast %x : memref<?xf32> to memref<*xf32>
    %s1 = call @runtime_mul_f32(%up, %ux, %w) : (memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32
    %s2 = call @runtime_sum_f32(%loss, %up, %all, %keepdims) : (memref<*xf32>, memref<*xf32>, i32, i32) -> i32
    linalg.fill ins(%zero : f32) outs(%x : memref<?xf32>)
    memref.dealloc %p : memref<?xf32>
    %failed = arith.cmpi ne, %s1, %ok : i32
    %s = arith.select %failed, %s1, %s2 : i32
    return %s : i32
  }

  // ---- gradients through a tape ----
  // begin (strict) -> watch the parameters -> declare the data constant -> run
  // `forward` -> end -> backward from the loss with cotangent 1 -> grad of each
  // parameter -> free (also after a failure: a handle must not leak).
  func.func private @tape_gradients(%forward: !forward, %loss: !m0, %gw1: !m2, %gb1: !m1, %gw2: !m2, %gb2: !m1,
                                    %x: !m2, %labels: !l1, %w1: !m2, %b1: !m1, %w2: !m2, %b2: !m1) -> i32 {
    %c0 = arith.constant 0 : index
    %ok = arith.constant 0 : i32
    %strict = arith.constant 0 : i32  // KINA_TAPE_STRICT
    %one = arith.constant 1.0 : f32
    %cell = memref.alloca() : memref<1xi64>
    %ucell = memref.cast %cell : memref<1xi64> to memref<*xi64>
    %ones = memref.alloca() : memref<f32>
    memref.store %one, %ones[] : memref<f32>
    %uones = memref.cast %ones : memref<f32> to memref<*xf32>
    %ux = memref.cast %x : !m2 to memref<*xf32>
    %ulabels = memref.cast %labels : !l1 to memref<*xi64>
    %uw1 = memref.cast %w1 : !m2 to memref<*xf32>
    %ub1 = memref.cast %b1 : !m1 to memref<*xf32>
    %uw2 = memref.cast %w2 : !m2 to memref<*xf32>
    %ub2 = memref.cast %b2 : !m1 to memref<*xf32>
    %ugw1 = memref.cast %gw1 : !m2 to memref<*xf32>
    %ugb1 = memref.cast %gb1 : !m1 to memref<*xf32>
    %ugw2 = memref.cast %gw2 : !m2 to memref<*xf32>
    %ugb2 = memref.cast %gb2 : !m1 to memref<*xf32>
    %uloss = memref.cast %loss : !m0 to memref<*xf32>

    %sb = call @kina_tape_begin(%ucell, %strict) : (memref<*xi64>, i32) -> i32
    %okb = arith.cmpi eq, %sb, %ok : i32
    cf.cond_br %okb, ^begun, ^out(%sb : i32)
  ^begun:
    %tape = memref.load %cell[%c0] : memref<1xi64>
    %s1 = call @kina_tape_watch_f32(%tape, %uw1) : (i64, memref<*xf32>) -> i32
    %ok1 = arith.cmpi eq, %s1, %ok : i32
    cf.cond_br %ok1, ^watch_b1, ^free(%s1 : i32)
  ^watch_b1:
    %s2 = call @kina_tape_watch_f32(%tape, %ub1) : (i64, memref<*xf32>) -> i32
    %ok2 = arith.cmpi eq, %s2, %ok : i32
    cf.cond_br %ok2, ^watch_w2, ^free(%s2 : i32)
  ^watch_w2:
    %s3 = call @kina_tape_watch_f32(%tape, %uw2) : (i64, memref<*xf32>) -> i32
    %ok3 = arith.cmpi eq, %s3, %ok : i32
    cf.cond_br %ok3, ^watch_b2, ^free(%s3 : i32)
  ^watch_b2:
    %s4 = call @kina_tape_watch_f32(%tape, %ub2) : (i64, memref<*xf32>) -> i32
    %ok4 = arith.cmpi eq, %s4, %ok : i32
    cf.cond_br %ok4, ^constant_x, ^free(%s4 : i32)
  ^constant_x:
    %s5 = call @kina_tape_constant_f32(%tape, %ux) : (i64, memref<*xf32>) -> i32
    %ok5 = arith.cmpi eq, %s5, %ok : i32
    cf.cond_br %ok5, ^constant_labels, ^free(%s5 : i32)
  ^constant_labels:
    %s6 = call @kina_tape_constant_i64(%tape, %ulabels) : (i64, memref<*xi64>) -> i32
    %ok6 = arith.cmpi eq, %s6, %ok : i32
    cf.cond_br %ok6, ^forward, ^free(%s6 : i32)
  ^forward:
    %s7 = func.call_indirect %forward(%loss, %x, %labels, %w1, %b1, %w2, %b2) : !forward
    %ok7 = arith.cmpi eq, %s7, %ok : i32
    cf.cond_br %ok7, ^end, ^free(%s7 : i32)
  ^end:
    %s8 = call @kina_tape_end(%tape) : (i64) -> i32
    %ok8 = arith.cmpi eq, %s8, %ok : i32
    cf.cond_br %ok8, ^backward, ^free(%s8 : i32)
  ^backward:
    %s9 = call @kina_tape_backward_f32(%tape, %uloss, %uones) : (i64, memref<*xf32>, memref<*xf32>) -> i32
    %ok9 = arith.cmpi eq, %s9, %ok : i32
    cf.cond_br %ok9, ^grad_w1, ^free(%s9 : i32)
  ^grad_w1:
    %s10 = call @kina_tape_grad_f32(%tape, %uw1, %ugw1) : (i64, memref<*xf32>, memref<*xf32>) -> i32
    %ok10 = arith.cmpi eq, %s10, %ok : i32
    cf.cond_br %ok10, ^grad_b1, ^free(%s10 : i32)
  ^grad_b1:
    %s11 = call @kina_tape_grad_f32(%tape, %ub1, %ugb1) : (i64, memref<*xf32>, memref<*xf32>) -> i32
    %ok11 = arith.cmpi eq, %s11, %ok : i32
    cf.cond_br %ok11, ^grad_w2, ^free(%s11 : i32)
  ^grad_w2:
    %s12 = call @kina_tape_grad_f32(%tape, %uw2, %ugw2) : (i64, memref<*xf32>, memref<*xf32>) -> i32
    %ok12 = arith.cmpi eq, %s12, %ok : i32
    cf.cond_br %ok12, ^grad_b2, ^free(%s12 : i32)
  ^grad_b2:
    %s13 = call @kina_tape_grad_f32(%tape, %ub2, %ugb2) : (i64, memref<*xf32>, memref<*xf32>) -> i32
    cf.br ^free(%s13 : i32)
  ^free(%status: i32):
    %sf = call @kina_tape_free(%tape) : (i64) -> i32
    %failed = arith.cmpi ne, %status, %ok : i32
    %first = arith.select %failed, %status, %sf : i32
    cf.br ^out(%first : i32)
  ^out(%result: i32):
    return %result : i32
  }

  func.func @mlp_grads(%loss: !m0, %gw1: !m2, %gb1: !m1, %gw2: !m2, %gb2: !m1,
                       %x: !m2, %labels: !l1, %w1: !m2, %b1: !m1, %w2: !m2, %b2: !m1) -> i32
      attributes {llvm.emit_c_interface} {
    %forward = func.constant @mlp_loss : !forward
    %s = call @tape_gradients(%forward, %loss, %gw1, %gb1, %gw2, %gb2, %x, %labels, %w1, %b1, %w2, %b2)
        : (!forward, !m0, !m2, !m1, !m2, !m1, !m2, !l1, !m2, !m1, !m2, !m1) -> i32
    return %s : i32
  }

  func.func @mlp_grads_loops(%loss: !m0, %gw1: !m2, %gb1: !m1, %gw2: !m2, %gb2: !m1,
                             %x: !m2, %labels: !l1, %w1: !m2, %b1: !m1, %w2: !m2, %b2: !m1) -> i32
      attributes {llvm.emit_c_interface} {
    %forward = func.constant @mlp_loss_loops : !forward
    %s = call @tape_gradients(%forward, %loss, %gw1, %gb1, %gw2, %gb2, %x, %labels, %w1, %b1, %w2, %b2)
        : (!forward, !m0, !m2, !m1, !m2, !m1, !m2, !l1, !m2, !m1, !m2, !m1) -> i32
    return %s : i32
  }

  // ---- a deterministic problem ----
  // Element k (row-major) of a parameter is ((k * a + b) mod m - m / 2) * scale + shift:
  // exact in float32.  b1's values are odd multiples of 1/128 while x @ w1 is a
  // multiple of 1/32, so no pre-activation sits on relu's kink (where central
  // differences and the derivative disagree).
  func.func private @pattern(%k: index, %a: i64, %b: i64, %m: i64, %scale: f32, %shift: f32) -> f32 {
    %ki = arith.index_cast %k : index to i64
    %t0 = arith.muli %ki, %a : i64
    %t1 = arith.addi %t0, %b : i64
    %t2 = arith.remsi %t1, %m : i64
    %two = arith.constant 2 : i64
    %half = arith.divsi %m, %two : i64
    %t3 = arith.subi %t2, %half : i64
    %f = arith.sitofp %t3 : i64 to f32
    %g = arith.mulf %f, %scale : f32
    %v = arith.addf %g, %shift : f32
    return %v : f32
  }

  func.func private @fill2(%t: !m2, %a: i64, %b: i64, %m: i64, %scale: f32, %shift: f32) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %rows = memref.dim %t, %c0 : !m2
    %cols = memref.dim %t, %c1 : !m2
    scf.for %i = %c0 to %rows step %c1 {
      scf.for %j = %c0 to %cols step %c1 {
        %r = arith.muli %i, %cols : index
        %k = arith.addi %r, %j : index
        %v = func.call @pattern(%k, %a, %b, %m, %scale, %shift) : (index, i64, i64, i64, f32, f32) -> f32
        memref.store %v, %t[%i, %j] : !m2
      }
    }
    return
  }

  func.func private @fill1(%t: !m1, %a: i64, %b: i64, %m: i64, %scale: f32, %shift: f32) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %n = memref.dim %t, %c0 : !m1
    scf.for %k = %c0 to %n step %c1 {
      %v = func.call @pattern(%k, %a, %b, %m, %scale, %shift) : (index, i64, i64, i64, f32, f32) -> f32
      memref.store %v, %t[%k] : !m1
    }
    return
  }

  // labels[i] = (2 i + 1) mod C, with C = the number of columns of w2.
  func.func @mlp_problem(%x: !m2, %labels: !l1, %w1: !m2, %b1: !m1, %w2: !m2, %b2: !m1) -> i32
      attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %i0 = arith.constant 0 : i64
    %i1 = arith.constant 1 : i64
    %i2 = arith.constant 2 : i64
    %i3 = arith.constant 3 : i64
    %i4 = arith.constant 4 : i64
    %i5 = arith.constant 5 : i64
    %i7 = arith.constant 7 : i64
    %i11 = arith.constant 11 : i64
    %i13 = arith.constant 13 : i64
    %quarter = arith.constant 0.25 : f32
    %eighth = arith.constant 0.125 : f32
    %sixteenth = arith.constant 0.0625 : f32
    %sixtyfourth = arith.constant 0.015625 : f32
    %odd = arith.constant 0.0078125 : f32
    %zero = arith.constant 0.0 : f32
    call @fill2(%x, %i7, %i3, %i13, %quarter, %zero) : (!m2, i64, i64, i64, f32, f32) -> ()
    call @fill2(%w1, %i5, %i1, %i11, %eighth, %zero) : (!m2, i64, i64, i64, f32, f32) -> ()
    call @fill1(%b1, %i3, %i2, %i7, %sixtyfourth, %odd) : (!m1, i64, i64, i64, f32, f32) -> ()
    call @fill2(%w2, %i4, %i5, %i11, %eighth, %zero) : (!m2, i64, i64, i64, f32, f32) -> ()
    call @fill1(%b2, %i1, %i0, %i5, %sixteenth, %zero) : (!m1, i64, i64, i64, f32, f32) -> ()
    %n = memref.dim %labels, %c0 : !l1
    %classes = memref.dim %w2, %c1 : !m2
    %ci = arith.index_cast %classes : index to i64
    scf.for %i = %c0 to %n step %c1 {
      %ii = arith.index_cast %i : index to i64
      %t = arith.muli %ii, %i2 : i64
      %t1 = arith.addi %t, %i1 : i64
      %l = arith.remsi %t1, %ci : i64
      memref.store %l, %labels[%i] : !l1
    }
    %ok = arith.constant 0 : i32
    return %ok : i32
  }

  // ---- @main, for mlir-cpu-runner-19 ----
  llvm.func @printf(!llvm.ptr, ...) -> i32
  llvm.func @kina_last_error() -> !llvm.ptr
  llvm.mlir.global internal constant @fmt_status("status %s %d\0A\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @fmt_error("error %s: %s\0A\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @fmt_value("value %s %ld %.9g\0A\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @fmt_scalar("value %s 0 %.17g\0A\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_grads("mlp_grads\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_loops("mlp_grads_loops\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_overwritten("overwritten_loss\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_loss("loss\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_checksum("checksum\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_gw1("gw1\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_gb1("gb1\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_gw2("gw2\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_gb2("gb2\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_begin_bad_flags("begin_bad_flags\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_backward_before_end("backward_before_end\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_end_twice("end_twice\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_watch_after_end("watch_after_end\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_grad_before_backward("grad_before_backward\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_backward_not_produced("backward_not_produced\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_cotangent_shape("cotangent_shape\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_backward_ok("backward_ok\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_grad_unwatched("grad_unwatched\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_free_ok("free_ok\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_stale_handle("stale_handle\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_freed_twice("freed_twice\00") {addr_space = 0 : i32}
  llvm.mlir.global internal constant @name_setup("setup\00") {addr_space = 0 : i32}

  func.func private @print_status(%name: !llvm.ptr, %status: i32) {
    %fmt = llvm.mlir.addressof @fmt_status : !llvm.ptr
    %p = llvm.call @printf(%fmt, %name, %status) vararg(!llvm.func<i32 (ptr, ...)>) : (!llvm.ptr, !llvm.ptr, i32) -> i32
    %ok = arith.constant 0 : i32
    %failed = arith.cmpi ne, %status, %ok : i32
    scf.if %failed {
      %efmt = llvm.mlir.addressof @fmt_error : !llvm.ptr
      %text = llvm.call @kina_last_error() : () -> !llvm.ptr
      %q = llvm.call @printf(%efmt, %name, %text) vararg(!llvm.func<i32 (ptr, ...)>) : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> i32
    }
    return
  }

  // Prints "name k value" for element k (row-major) of a flattened buffer and
  // returns checksum + sum over k of (start + k + 1) * value.
  func.func private @print_values(%name: !llvm.ptr, %flat: memref<?xf32, strided<[?], offset: ?>>, %start: index, %checksum: f64) -> f64 {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %fmt = llvm.mlir.addressof @fmt_value : !llvm.ptr
    %n = memref.dim %flat, %c0 : memref<?xf32, strided<[?], offset: ?>>
    %sum = scf.for %k = %c0 to %n step %c1 iter_args(%acc = %checksum) -> f64 {
      %v = memref.load %flat[%k] : memref<?xf32, strided<[?], offset: ?>>
      %vd = arith.extf %v : f32 to f64
      %ki = arith.index_cast %k : index to i64
      %p = llvm.call @printf(%fmt, %name, %ki, %vd) vararg(!llvm.func<i32 (ptr, ...)>) : (!llvm.ptr, !llvm.ptr, i64, f64) -> i32
      %g = arith.addi %start, %k : index
      %g1 = arith.addi %g, %c1 : index
      %gi = arith.index_cast %g1 : index to i64
      %w = arith.sitofp %gi : i64 to f64
      %t = arith.mulf %w, %vd : f64
      %acc2 = arith.addf %acc, %t : f64
      scf.yield %acc2 : f64
    }
    return %sum : f64
  }

  // A tape that records the forward, then sees the loss overwritten before
  // backward: backward must refuse (status 1, "overwritten").
  func.func private @backward_after_overwrite(%loss: !m0, %x: !m2, %labels: !l1,
                                              %w1: !m2, %b1: !m1, %w2: !m2, %b2: !m1) -> i32 {
    %c0 = arith.constant 0 : index
    %ok = arith.constant 0 : i32
    %strict = arith.constant 0 : i32
    %one = arith.constant 1.0 : f32
    %bogus = arith.constant 42.0 : f32
    %cell = memref.alloca() : memref<1xi64>
    %ucell = memref.cast %cell : memref<1xi64> to memref<*xi64>
    %ones = memref.alloca() : memref<f32>
    memref.store %one, %ones[] : memref<f32>
    %uones = memref.cast %ones : memref<f32> to memref<*xf32>
    %uloss = memref.cast %loss : !m0 to memref<*xf32>
    %ux = memref.cast %x : !m2 to memref<*xf32>
    %ulabels = memref.cast %labels : !l1 to memref<*xi64>
    %uw1 = memref.cast %w1 : !m2 to memref<*xf32>
    %ub1 = memref.cast %b1 : !m1 to memref<*xf32>
    %uw2 = memref.cast %w2 : !m2 to memref<*xf32>
    %ub2 = memref.cast %b2 : !m1 to memref<*xf32>
    %sb = call @kina_tape_begin(%ucell, %strict) : (memref<*xi64>, i32) -> i32
    %tape = memref.load %cell[%c0] : memref<1xi64>
    %s1 = call @kina_tape_watch_f32(%tape, %uw1) : (i64, memref<*xf32>) -> i32
    %s2 = call @kina_tape_watch_f32(%tape, %ub1) : (i64, memref<*xf32>) -> i32
    %s3 = call @kina_tape_watch_f32(%tape, %uw2) : (i64, memref<*xf32>) -> i32
    %s4 = call @kina_tape_watch_f32(%tape, %ub2) : (i64, memref<*xf32>) -> i32
    %s5 = call @kina_tape_constant_f32(%tape, %ux) : (i64, memref<*xf32>) -> i32
    %s6 = call @kina_tape_constant_i64(%tape, %ulabels) : (i64, memref<*xi64>) -> i32
    %s7 = call @mlp_loss(%loss, %x, %labels, %w1, %b1, %w2, %b2) : (!m0, !m2, !l1, !m2, !m1, !m2, !m1) -> i32
    %s8 = call @kina_tape_end(%tape) : (i64) -> i32
    // The host reuses the loss buffer (MLIR code, not a runtime op: the tape cannot see it).
    memref.store %bogus, %loss[] : !m0
    %s9 = call @kina_tape_backward_f32(%tape, %uloss, %uones) : (i64, memref<*xf32>, memref<*xf32>) -> i32
    %s10 = call @kina_tape_free(%tape) : (i64) -> i32
    // Everything before backward must have succeeded: fold those statuses into one.
    %e1 = arith.ori %sb, %s1 : i32
    %e2 = arith.ori %e1, %s2 : i32
    %e3 = arith.ori %e2, %s3 : i32
    %e4 = arith.ori %e3, %s4 : i32
    %e5 = arith.ori %e4, %s5 : i32
    %e6 = arith.ori %e5, %s6 : i32
    %e7 = arith.ori %e6, %s7 : i32
    %e8 = arith.ori %e7, %s8 : i32
    %e9 = arith.ori %e8, %s10 : i32
    %setup_ok = arith.cmpi eq, %e9, %ok : i32
    %bad = arith.constant 100 : i32
    %r = arith.select %setup_ok, %s9, %bad : i32
    return %r : i32
  }

  // The tape ABI's answers to misuse, in the order a confused host might make
  // them; each is printed as "status <name> <code>" (and its error text).
  // test_mlir_tape.py holds the expected code and message of each name and
  // checks tape_host.c's run with the same table.
  func.func private @bad_inputs(%x: !m2, %w1: !m2, %b1: !m1) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %strict = arith.constant 0 : i32
    %bogus_flags = arith.constant 7 : i32
    %one = arith.constant 1.0 : f32
    %n = memref.dim %x, %c0 : !m2
    %d = memref.dim %x, %c1 : !m2
    %h = memref.dim %w1, %c1 : !m2
    %cell = memref.alloca() : memref<1xi64>
    %ucell = memref.cast %cell : memref<1xi64> to memref<*xi64>
    %z = memref.alloc(%n, %h) : memref<?x?xf32>
    %zcot = memref.alloc(%n, %h) : memref<?x?xf32>
    %xcot = memref.alloc(%n, %d) : memref<?x?xf32>
    %gw1 = memref.alloc(%d, %h) : memref<?x?xf32>
    %gx = memref.alloc(%n, %d) : memref<?x?xf32>
    linalg.fill ins(%one : f32) outs(%zcot : memref<?x?xf32>)
    linalg.fill ins(%one : f32) outs(%xcot : memref<?x?xf32>)
    %uz = memref.cast %z : memref<?x?xf32> to memref<*xf32>
    %uzcot = memref.cast %zcot : memref<?x?xf32> to memref<*xf32>
    %uxcot = memref.cast %xcot : memref<?x?xf32> to memref<*xf32>
    %ugw1 = memref.cast %gw1 : memref<?x?xf32> to memref<*xf32>
    %ugx = memref.cast %gx : memref<?x?xf32> to memref<*xf32>
    %ux = memref.cast %x : !m2 to memref<*xf32>
    %uw1 = memref.cast %w1 : !m2 to memref<*xf32>
    %ub1 = memref.cast %b1 : !m1 to memref<*xf32>

    %s1 = call @kina_tape_begin(%ucell, %bogus_flags) : (memref<*xi64>, i32) -> i32
    %n1 = llvm.mlir.addressof @name_begin_bad_flags : !llvm.ptr
    call @print_status(%n1, %s1) : (!llvm.ptr, i32) -> ()

    // A tape recording z = x @ w1.
    %sb = call @kina_tape_begin(%ucell, %strict) : (memref<*xi64>, i32) -> i32
    %tape = memref.load %cell[%c0] : memref<1xi64>
    %sw = call @kina_tape_watch_f32(%tape, %uw1) : (i64, memref<*xf32>) -> i32
    %sc = call @kina_tape_constant_f32(%tape, %ux) : (i64, memref<*xf32>) -> i32
    %sm = call @runtime_gpu_matmul_f32(%uz, %ux, %uw1) : (memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32
    %e1 = arith.ori %sb, %sw : i32
    %e2 = arith.ori %e1, %sc : i32
    %e3 = arith.ori %e2, %sm : i32
    %nsetup = llvm.mlir.addressof @name_setup : !llvm.ptr
    call @print_status(%nsetup, %e3) : (!llvm.ptr, i32) -> ()

    %s2 = call @kina_tape_backward_f32(%tape, %uz, %uzcot) : (i64, memref<*xf32>, memref<*xf32>) -> i32
    %n2 = llvm.mlir.addressof @name_backward_before_end : !llvm.ptr
    call @print_status(%n2, %s2) : (!llvm.ptr, i32) -> ()
    %se = call @kina_tape_end(%tape) : (i64) -> i32
    %s3 = call @kina_tape_end(%tape) : (i64) -> i32
    %n3 = llvm.mlir.addressof @name_end_twice : !llvm.ptr
    call @print_status(%n3, %s3) : (!llvm.ptr, i32) -> ()
    %s4 = call @kina_tape_watch_f32(%tape, %ub1) : (i64, memref<*xf32>) -> i32
    %n4 = llvm.mlir.addressof @name_watch_after_end : !llvm.ptr
    call @print_status(%n4, %s4) : (!llvm.ptr, i32) -> ()
    %s5 = call @kina_tape_grad_f32(%tape, %uw1, %ugw1) : (i64, memref<*xf32>, memref<*xf32>) -> i32
    %n5 = llvm.mlir.addressof @name_grad_before_backward : !llvm.ptr
    call @print_status(%n5, %s5) : (!llvm.ptr, i32) -> ()
    %s6 = call @kina_tape_backward_f32(%tape, %ux, %uxcot) : (i64, memref<*xf32>, memref<*xf32>) -> i32
    %n6 = llvm.mlir.addressof @name_backward_not_produced : !llvm.ptr
    call @print_status(%n6, %s6) : (!llvm.ptr, i32) -> ()
    %s7 = call @kina_tape_backward_f32(%tape, %uz, %uxcot) : (i64, memref<*xf32>, memref<*xf32>) -> i32
    %n7 = llvm.mlir.addressof @name_cotangent_shape : !llvm.ptr
    call @print_status(%n7, %s7) : (!llvm.ptr, i32) -> ()
    %s8 = call @kina_tape_backward_f32(%tape, %uz, %uzcot) : (i64, memref<*xf32>, memref<*xf32>) -> i32
    %n8 = llvm.mlir.addressof @name_backward_ok : !llvm.ptr
    call @print_status(%n8, %s8) : (!llvm.ptr, i32) -> ()
    %s9 = call @kina_tape_grad_f32(%tape, %ux, %ugx) : (i64, memref<*xf32>, memref<*xf32>) -> i32
    %n9 = llvm.mlir.addressof @name_grad_unwatched : !llvm.ptr
    call @print_status(%n9, %s9) : (!llvm.ptr, i32) -> ()
    %s10 = call @kina_tape_free(%tape) : (i64) -> i32
    %n10 = llvm.mlir.addressof @name_free_ok : !llvm.ptr
    call @print_status(%n10, %s10) : (!llvm.ptr, i32) -> ()
    %s11 = call @kina_tape_watch_f32(%tape, %uw1) : (i64, memref<*xf32>) -> i32
    %n11 = llvm.mlir.addressof @name_stale_handle : !llvm.ptr
    call @print_status(%n11, %s11) : (!llvm.ptr, i32) -> ()
    %s12 = call @kina_tape_free(%tape) : (i64) -> i32
    %n12 = llvm.mlir.addressof @name_freed_twice : !llvm.ptr
    call @print_status(%n12, %s12) : (!llvm.ptr, i32) -> ()
    memref.dealloc %z : memref<?x?xf32>
    memref.dealloc %zcot : memref<?x?xf32>
    memref.dealloc %xcot : memref<?x?xf32>
    memref.dealloc %gw1 : memref<?x?xf32>
    memref.dealloc %gx : memref<?x?xf32>
    return
  }

  func.func @main() -> i32 {
    %c0 = arith.constant 0 : index
    %c3 = arith.constant 3 : index
    %c4 = arith.constant 4 : index
    %c5 = arith.constant 5 : index
    %c6 = arith.constant 6 : index
    %zero = arith.constant 0.0 : f64
    %x0 = memref.alloc() : memref<6x4xf32>
    %labels0 = memref.alloc() : memref<6xi64>
    %w10 = memref.alloc() : memref<4x5xf32>
    %b10 = memref.alloc() : memref<5xf32>
    %w20 = memref.alloc() : memref<5x3xf32>
    %b20 = memref.alloc() : memref<3xf32>
    %gw10 = memref.alloc() : memref<4x5xf32>
    %gb10 = memref.alloc() : memref<5xf32>
    %gw20 = memref.alloc() : memref<5x3xf32>
    %gb20 = memref.alloc() : memref<3xf32>
    %loss0 = memref.alloc() : memref<f32>
    %x = memref.cast %x0 : memref<6x4xf32> to !m2
    %labels = memref.cast %labels0 : memref<6xi64> to !l1
    %w1 = memref.cast %w10 : memref<4x5xf32> to !m2
    %b1 = memref.cast %b10 : memref<5xf32> to !m1
    %w2 = memref.cast %w20 : memref<5x3xf32> to !m2
    %b2 = memref.cast %b20 : memref<3xf32> to !m1
    %gw1 = memref.cast %gw10 : memref<4x5xf32> to !m2
    %gb1 = memref.cast %gb10 : memref<5xf32> to !m1
    %gw2 = memref.cast %gw20 : memref<5x3xf32> to !m2
    %gb2 = memref.cast %gb20 : memref<3xf32> to !m1
    %loss = memref.cast %loss0 : memref<f32> to !m0
    %sp = call @mlp_problem(%x, %labels, %w1, %b1, %w2, %b2) : (!m2, !l1, !m2, !m1, !m2, !m1) -> i32

    // Gradients through the tape, all in MLIR.
    %sg = call @mlp_grads(%loss, %gw1, %gb1, %gw2, %gb2, %x, %labels, %w1, %b1, %w2, %b2)
        : (!m0, !m2, !m1, !m2, !m1, !m2, !l1, !m2, !m1, !m2, !m1) -> i32
    %ngrads = llvm.mlir.addressof @name_grads : !llvm.ptr
    call @print_status(%ngrads, %sg) : (!llvm.ptr, i32) -> ()
    %lv = memref.load %loss0[] : memref<f32>
    %lvd = arith.extf %lv : f32 to f64
    %fscalar = llvm.mlir.addressof @fmt_scalar : !llvm.ptr
    %nloss = llvm.mlir.addressof @name_loss : !llvm.ptr
    %p1 = llvm.call @printf(%fscalar, %nloss, %lvd) vararg(!llvm.func<i32 (ptr, ...)>) : (!llvm.ptr, !llvm.ptr, f64) -> i32
    %fw1 = memref.collapse_shape %gw10 [[0, 1]] : memref<4x5xf32> into memref<20xf32>
    %fw2 = memref.collapse_shape %gw20 [[0, 1]] : memref<5x3xf32> into memref<15xf32>
    %flat_w1 = memref.cast %fw1 : memref<20xf32> to memref<?xf32, strided<[?], offset: ?>>
    %flat_w2 = memref.cast %fw2 : memref<15xf32> to memref<?xf32, strided<[?], offset: ?>>
    %c20 = arith.constant 20 : index
    %c25 = arith.constant 25 : index
    %c40 = arith.constant 40 : index
    %ngw1 = llvm.mlir.addressof @name_gw1 : !llvm.ptr
    %ngb1 = llvm.mlir.addressof @name_gb1 : !llvm.ptr
    %ngw2 = llvm.mlir.addressof @name_gw2 : !llvm.ptr
    %ngb2 = llvm.mlir.addressof @name_gb2 : !llvm.ptr
    %k1 = call @print_values(%ngw1, %flat_w1, %c0, %zero) : (!llvm.ptr, memref<?xf32, strided<[?], offset: ?>>, index, f64) -> f64
    %k2 = call @print_values(%ngb1, %gb1, %c20, %k1) : (!llvm.ptr, memref<?xf32, strided<[?], offset: ?>>, index, f64) -> f64
    %k3 = call @print_values(%ngw2, %flat_w2, %c25, %k2) : (!llvm.ptr, memref<?xf32, strided<[?], offset: ?>>, index, f64) -> f64
    %k4 = call @print_values(%ngb2, %gb2, %c40, %k3) : (!llvm.ptr, memref<?xf32, strided<[?], offset: ?>>, index, f64) -> f64
    %nchecksum = llvm.mlir.addressof @name_checksum : !llvm.ptr
    %p2 = llvm.call @printf(%fscalar, %nchecksum, %k4) vararg(!llvm.func<i32 (ptr, ...)>) : (!llvm.ptr, !llvm.ptr, f64) -> i32

    // Strict mode: relu in loops leaves the hidden activation unaccounted for.
    %sl = call @mlp_grads_loops(%loss, %gw1, %gb1, %gw2, %gb2, %x, %labels, %w1, %b1, %w2, %b2)
        : (!m0, !m2, !m1, !m2, !m1, !m2, !l1, !m2, !m1, !m2, !m1) -> i32
    %nloops = llvm.mlir.addressof @name_loops : !llvm.ptr
    call @print_status(%nloops, %sl) : (!llvm.ptr, i32) -> ()

    // A recorded buffer overwritten before backward.
    %so = call @backward_after_overwrite(%loss, %x, %labels, %w1, %b1, %w2, %b2)
        : (!m0, !m2, !l1, !m2, !m1, !m2, !m1) -> i32
    %nover = llvm.mlir.addressof @name_overwritten : !llvm.ptr
    call @print_status(%nover, %so) : (!llvm.ptr, i32) -> ()

    call @bad_inputs(%x, %w1, %b1) : (!m2, !m2, !m1) -> ()

    memref.dealloc %x0 : memref<6x4xf32>
    memref.dealloc %labels0 : memref<6xi64>
    memref.dealloc %w10 : memref<4x5xf32>
    memref.dealloc %b10 : memref<5xf32>
    memref.dealloc %w20 : memref<5x3xf32>
    memref.dealloc %b20 : memref<3xf32>
    memref.dealloc %gw10 : memref<4x5xf32>
    memref.dealloc %gb10 : memref<5xf32>
    memref.dealloc %gw20 : memref<5x3xf32>
    memref.dealloc %gb20 : memref<3xf32>
    memref.dealloc %loss0 : memref<f32>
    return %sp : i32
  }
}
