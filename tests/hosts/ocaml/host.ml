(* An OCaml host of libkina_fx.so's effects C ABI.

   OCaml drives fibers whose bodies are C functions (kina_stubs.c) and acts as
   their effect handler: a generator whose yields OCaml collects and answers,
   and a state handler (Get/Put) kept in an OCaml ref.  It also pushes a C
   handler on the root handler stack and checks error statuses. *)

external effect_id : string -> int = "ml_kina_effect_id"
external fiber_create : int -> int -> int -> int -> int64 = "ml_kina_fiber_create"
external resume : int64 -> int -> int = "ml_kina_resume_fiber"
external resume_status : int64 -> int -> int = "ml_kina_resume_status"
external perform_id : int64 -> int = "ml_kina_get_perform_id"
external perform_args : int64 -> int array = "ml_kina_get_perform_args"
external result : int64 -> int = "ml_kina_fiber_result"
external destroy : int64 -> unit = "ml_kina_fiber_destroy"
external push_scaling : int -> int64 = "ml_kina_push_scaling_handler"
external pop_handler : int64 -> unit = "ml_kina_pop_handler"
external pop_status : int64 -> int = "ml_kina_pop_status"
external perform1 : int -> int -> int = "ml_kina_perform1"

let suspended = 2 and finished = 3
let validation_error = 1

let checks = ref 0
let failures = ref 0
let check name ok =
  incr checks;
  if not ok then begin incr failures; Printf.printf "FAIL: %s\n%!" name end

(* A generator: collect every yielded value, answer each with 10x it. *)
let generator () =
  let yield_ = effect_id "ocaml.yield" in
  let f = fiber_create 0 6 yield_ 0 in
  let rec loop answer acc =
    let st = resume f answer in
    if st = suspended then begin
      check "perform id is Yield" (perform_id f = yield_);
      let v = (perform_args f).(0) in
      loop (10 * v) (v :: acc)
    end else begin
      check "generator finished" (st = finished);
      List.rev acc
    end
  in
  let yielded = loop 0 [] in
  check "yielded 0..5" (yielded = [0; 1; 2; 3; 4; 5]);
  check "generator result" (result f = 10 * (0 + 1 + 2 + 3 + 4 + 5));
  check "resume finished fiber" (resume_status f 0 = validation_error);
  destroy f;
  check "stale handle" (resume_status f 0 = validation_error);
  Printf.printf "generator: %s\n%!" (String.concat " " (List.map string_of_int yielded))

(* A state handler: the fiber performs Get/Put, OCaml keeps the state. *)
let state_handler () =
  let get = effect_id "ocaml.get" and put = effect_id "ocaml.put" in
  let state = ref 100 in
  let rounds = 50 in
  let f = fiber_create 1 rounds get put in
  let rec run answer =
    let st = resume f answer in
    if st = suspended then begin
      let e = perform_id f in
      if e = get then run !state
      else if e = put then begin state := (perform_args f).(0); run 0 end
      else (check "unexpected effect" false; run 0)
    end else st
  in
  let st = run 0 in
  let expected = 100 + (rounds - 1) * rounds / 2 in
  check "state fiber finished" (st = finished);
  check "state result" (result f = expected);
  check "final state" (!state = expected);
  destroy f;
  Printf.printf "state: final %d\n%!" !state

(* A C handler on the root stack, answering in place. *)
let c_handler () =
  let scale = effect_id "ocaml.scale" in
  let h = push_scaling scale in
  check "C handler answers in place" (perform1 scale 14 = 42);
  pop_handler h;
  check "popping twice is a validation error" (pop_status h = validation_error);
  check "unhandled after pop"
    (try ignore (perform1 scale 1); false with Failure msg -> String.length msg > 0)

let () =
  generator ();
  state_handler ();
  c_handler ();
  if !failures > 0 then (Printf.printf "ocaml host: %d of %d checks FAILED\n" !failures !checks; exit 1)
  else Printf.printf "ocaml host: %d checks passed\n" !checks
