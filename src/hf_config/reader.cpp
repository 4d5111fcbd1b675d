// The checkpoint config reader compiled once: rope::hf::parse, from_json
// and load for the users of rope::hf_config built with
// -DROPE_HF_CONFIG_LIBRARY=ON (cmake/ropeHfConfigLibrary.cmake), whose
// translation units then see their declarations only (hf_config.hpp).
#if !defined(ROPE_HF_CONFIG_LIBRARY)
#error "src/hf_config/reader.cpp is built with ROPE_HF_CONFIG_LIBRARY defined (the rope_hf_config_reader target)"
#endif

#include <rope/hf/definitions.hpp>
